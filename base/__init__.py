"""The bottom layer every other part of edgeflash may import: errors a user can fix, byte sizes,
resident-memory helpers and the model aliases. It imports nothing else of edgeflash."""

__version__ = "0.1.0"  # the package version, written into bundles and exported programs
