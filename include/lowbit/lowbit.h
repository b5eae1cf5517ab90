// Umbrella header: everything a C++ engine needs.
#pragma once

#include "lowbit/core.h"
#include "lowbit/dtype.h"
#include "lowbit/runtime.h"
#include "lowbit/tensor.h"
#include "lowbit/version.h"
