// The app's logic in plain Kotlin: it builds and runs on any JVM, so it is checked without a device.
plugins {
    id("org.jetbrains.kotlin.jvm")
}

kotlin {
    jvmToolchain(17)
}

sourceSets {
    // LogicCheck: runs the logic on a request file and prints JSON (tests/apps/test_android_logic.py
    // compares it with the Python twins).
    create("check") {
        kotlin.srcDir("src/check/kotlin")
        compileClasspath += sourceSets["main"].output + configurations["runtimeClasspath"]
        runtimeClasspath += output + compileClasspath
    }
}

// ./gradlew :llm:logicCheck -Prequest=path/to/request.json
tasks.register<JavaExec>("logicCheck") {
    classpath = sourceSets["check"].runtimeClasspath
    mainClass.set("org.edgeflash.llm.check.LogicCheckKt")
    args(project.findProperty("request")?.toString() ?: error("pass -Prequest=request.json"))
}
