#pragma once

#define LOWBIT_VERSION_MAJOR 0
#define LOWBIT_VERSION_MINOR 1
#define LOWBIT_VERSION_PATCH 0

namespace lowbit {
const char* version_string();  // "0.1.0"
const char* build_info();      // compiler, CUDA on/off, architectures
}  // namespace lowbit
