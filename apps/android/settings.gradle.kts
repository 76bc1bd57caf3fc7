pluginManagement {
    // Plugin versions live in gradle.properties, next to executorchVersion.
    val kotlinVersion: String by settings
    val androidGradlePluginVersion: String by settings
    repositories {
        google()
        mavenCentral()
        gradlePluginPortal()
    }
    plugins {
        id("com.android.application") version androidGradlePluginVersion
        id("org.jetbrains.kotlin.android") version kotlinVersion
        id("org.jetbrains.kotlin.jvm") version kotlinVersion
    }
}

dependencyResolutionManagement {
    repositoriesMode.set(RepositoriesMode.FAIL_ON_PROJECT_REPOS)
    repositories {
        google()
        mavenCentral() // org.pytorch:executorch-android
    }
}

rootProject.name = "edgeflash-android"
include(":llm") // plain Kotlin: manifest, chunk chain, schedule, sampler, tokenizer, ChunkedLlm (no Android APIs)
include(":app") // the chat app: ExecuTorch modules, Activity
