#!/usr/bin/env bash
# Regenerates tests/vectors/fieldless/ with Java Chronicle (../shared/java's jar and the Debian jars that
# ../shared/java/run.sh lists; run run.sh once first so they are installed). Run from the project root.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
root="$(cd "$here/../.." && pwd -P)"
shared="${CHRONQ_SHARED_JAVA:-$root/../shared/java}"
J=/usr/share/java
cp="$shared/chronicle-queue-5.26ea.jar"
for j in slf4j-api slf4j-simple jna jna-platform jnr-ffi jnr-constants jffi jnr-x86asm asm asm-commons asm-analysis asm-tree asm-util; do
    cp="$cp:$J/$j.jar"
done
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
javac -nowarn -encoding UTF-8 --release 17 -cp "$cp" -d "$build" "$here/FieldlessVectors.java"
out="$root/tests/vectors/fieldless"
rm -rf "$out"
mkdir -p "$out"
java --add-opens java.base/java.lang=ALL-UNNAMED --add-opens java.base/java.lang.reflect=ALL-UNNAMED \
    --add-opens java.base/java.io=ALL-UNNAMED --add-opens java.base/java.nio=ALL-UNNAMED \
    --add-opens java.base/sun.nio.ch=ALL-UNNAMED --add-opens java.base/java.util=ALL-UNNAMED \
    --add-opens java.base/java.util.concurrent=ALL-UNNAMED --add-opens java.base/jdk.internal.misc=ALL-UNNAMED \
    --add-exports java.base/jdk.internal.misc=ALL-UNNAMED --add-exports java.base/jdk.internal.ref=ALL-UNNAMED \
    --add-exports java.base/sun.nio.ch=ALL-UNNAMED --add-exports jdk.unsupported/sun.misc=ALL-UNNAMED \
    --add-exports jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED --add-opens jdk.compiler/com.sun.tools.javac=ALL-UNNAMED \
    -Dchronicle.analytics.disable=true -Dchronicle.announcer.disable=true -Djvm.resource.tracing=false \
    -Dchronicle.disk.monitor.disable=true -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
    "-Djava.io.tmpdir=$build" "-Dproject.build.directory=$build" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -cp "$build:$cp" chronqvectors.FieldlessVectors "$out"
