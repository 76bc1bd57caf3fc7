pluginManagement {
    repositories {
        google()
        mavenCentral()
        gradlePluginPortal()
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
include(":llm") // plain Kotlin: manifest, chunk chain, schedule, sampler, tokenizer (no Android APIs)
include(":app") // the chat app: ExecuTorch modules, Activity
