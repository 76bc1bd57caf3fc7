"""The Android sample's Gradle files against what the rest of the project uses.

No Android SDK or Maven repository is reachable here, so the Gradle build itself does not run
(apps/android/README.md says what does). These checks keep its versions tied to the facts they
follow: the ExecuTorch runtime release equals the `executorch` package that writes the programs,
and the Kotlin plugin equals the kotlinc that compiles llm/ in test_android_logic.py. They also
keep app/ down to the code that needs Android or ExecuTorch, since only llm/ compiles here.
"""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

from android_check import ANDROID, KOTLIN_VERSION, gradle_properties

REPO = Path(__file__).resolve().parents[2]
APP_SOURCES = ANDROID / "app" / "src" / "main" / "java"


def pinned(package: str) -> str:
    """The version pyproject.toml pins `package` to ("package==X" in a dependency list)."""
    pins = re.findall(rf'"{re.escape(package)}==([^"]+)"', (REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert len(pins) == 1, f"pyproject.toml should pin {package}==X once, found {pins}"
    return pins[0]


def test_executorch_runtime_matches_the_exporter():
    props = gradle_properties()
    assert props["executorchVersion"] == pinned("executorch")
    # The package installed here (1.5.1+cpu) is the one that wrote the programs the tests export.
    assert version("executorch").split("+")[0] == props["executorchVersion"]
    app = (ANDROID / "app" / "build.gradle.kts").read_text(encoding="utf-8")
    assert re.search(r'implementation\("org\.pytorch:executorch-android:\$\{project\.property\("executorchVersion"\)\}"\)',
                     app), "app/build.gradle.kts must take executorch-android's version from gradle.properties"


def test_plugin_versions_come_from_gradle_properties():
    props = gradle_properties()
    settings = (ANDROID / "settings.gradle.kts").read_text(encoding="utf-8")
    for plugin, prop in (("com.android.application", "androidGradlePluginVersion"),
                         ("org.jetbrains.kotlin.android", "kotlinVersion"), ("org.jetbrains.kotlin.jvm", "kotlinVersion")):
        assert re.search(rf'id\("{re.escape(plugin)}"\) version {prop}\b', settings), plugin
        assert prop in props
    assert KOTLIN_VERSION == props["kotlinVersion"]
    for build in (ANDROID / "build.gradle.kts", ANDROID / "app" / "build.gradle.kts", ANDROID / "llm" / "build.gradle.kts"):
        # A version written in a build file would bypass the one in gradle.properties.
        assert not re.search(r'id\("[^"]+"\) version "', build.read_text(encoding="utf-8")), build


def test_app_holds_only_android_and_executorch_code():
    """Everything else belongs in llm/, where test_android_logic.py compiles and runs it."""
    sources = sorted(APP_SOURCES.rglob("*.kt"))
    assert sources
    for source in sources:
        imports = re.findall(r"^import ([\w.]+)", source.read_text(encoding="utf-8"), re.MULTILINE)
        platform = [i for i in imports if i.startswith(("android.", "androidx.", "org.pytorch.executorch."))]
        assert platform, f"{source.relative_to(REPO)} uses neither Android nor ExecuTorch: move it to llm/"


def test_executorch_calls_use_the_kotlin_api():
    """executorch-android is written in Kotlin since 1.4: tensor data is a property
    (`dataAsFloatArray`), and Kotlin code cannot call a Kotlin property by its getter's name."""
    chunk = (APP_SOURCES / "org" / "edgeflash" / "chat" / "ExecuTorchChunk.kt").read_text(encoding="utf-8")
    assert not re.search(r"\.getDataAs\w+\(", chunk)
    assert ".dataAsFloatArray" in chunk and "Module.load(" in chunk and ".execute(" in chunk
