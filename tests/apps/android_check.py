"""Builds and runs the Android app's plain-Kotlin logic (apps/android/llm) on a JVM.

kotlinc comes from the npm package `kotlin-compiler`, installed into a cache directory on first
use; the compiled jar is cached by a hash of the sources, so an unchanged tree compiles once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANDROID = REPO / "apps" / "android"
LLM = ANDROID / "llm"


def gradle_properties() -> dict[str, str]:
    """apps/android/gradle.properties as a dict (the versions the Gradle build uses)."""
    props = {}
    for line in (ANDROID / "gradle.properties").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            props[key.strip()] = value.strip()
    return props


# The kotlinc of the Gradle build's Kotlin plugin, so what compiles here compiles there.
KOTLIN_VERSION = gradle_properties()["kotlinVersion"]
CACHE = Path(os.environ.get("EDGEFLASH_CACHE", Path.home() / ".cache" / "edgeflash")) / "kotlin"


def kotlin_home() -> Path:
    """The kotlin-compiler package directory (bin/kotlinc, lib/kotlin-stdlib.jar)."""
    home = CACHE / KOTLIN_VERSION / "node_modules" / "kotlin-compiler"
    if not (home / "bin" / "kotlinc").exists():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is needed to install kotlinc (npm package kotlin-compiler); install Node.js")
        subprocess.run([npm, "install", "--prefix", str(CACHE / KOTLIN_VERSION), "--no-audit", "--no-fund",
                        "--loglevel=error", f"kotlin-compiler@{KOTLIN_VERSION}"], check=True, timeout=600)
    return home


def sources() -> list[Path]:
    return sorted([*LLM.glob("src/main/kotlin/**/*.kt"), *LLM.glob("src/check/kotlin/**/*.kt")])


def compiled_jar() -> Path:
    home = kotlin_home()
    digest = hashlib.sha256(KOTLIN_VERSION.encode())
    for f in sources():
        digest.update(str(f.relative_to(LLM)).encode() + b"\0" + f.read_bytes())
    jar = CACHE / "jars" / f"llm-{digest.hexdigest()[:16]}.jar"
    if not jar.exists():
        jar.parent.mkdir(parents=True, exist_ok=True)
        tmp = jar.with_suffix(f".tmp{os.getpid()}.jar")
        done = subprocess.run([str(home / "bin" / "kotlinc"), "-nowarn", "-d", str(tmp), *map(str, sources())],
                              check=False, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise AssertionError(f"kotlinc failed:\n{done.stdout}\n{done.stderr}")
        os.replace(tmp, jar)
    return jar


def run_check(request: dict, workdir: Path) -> dict:
    """Run LogicCheck on `request`; returns its JSON result."""
    jar = compiled_jar()
    stdlib = kotlin_home() / "lib" / "kotlin-stdlib.jar"
    path = workdir / "request.json"
    path.write_text(json.dumps(request), encoding="utf-8")
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java (a JDK or JRE 17+) is needed to run the Kotlin checks; install openjdk-17-jre-headless")
    done = subprocess.run([java, "-cp", f"{jar}{os.pathsep}{stdlib}", "org.edgeflash.llm.check.LogicCheckKt", str(path)],
                          check=False, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"LogicCheck failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)
