def main() -> int:
    print("edgeflash")
    return 0
