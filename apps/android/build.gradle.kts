// Versions: pluginManagement in settings.gradle.kts, from gradle.properties.
plugins {
    id("com.android.application") apply false
    id("org.jetbrains.kotlin.android") apply false
    id("org.jetbrains.kotlin.jvm") apply false
}
