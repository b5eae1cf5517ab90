// Device discovery (lowbit/runtime.h): the device code lowbit reports for a GPU is the image the
// CUDA driver's rules pick from the architectures this build was compiled for.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "lowbit/lowbit.h"

namespace {

struct BuiltArch {
  int arch = 0;           // e.g. 89, 90
  bool specific = false;  // "90a": runs only on exactly that compute capability
  bool sass = true, ptx = true;
};

// build_info() names CMAKE_CUDA_ARCHITECTURES as "... (sm 80 89-real 90a)".
std::vector<BuiltArch> built_archs() {
  const std::string info = lowbit::build_info();
  std::vector<BuiltArch> out;
  const auto open = info.find("(sm ");
  if (open == std::string::npos) return out;
  std::istringstream in(info.substr(open + 4, info.find(')', open) - open - 4));
  std::string tok;
  while (in >> tok) {
    BuiltArch a;
    const auto dash = tok.find('-');
    const std::string kind = dash == std::string::npos ? "" : tok.substr(dash + 1);
    std::string num = tok.substr(0, dash);
    if (!num.empty() && (num.back() == 'a' || num.back() == 'f')) {
      a.specific = true;
      num.pop_back();
    }
    if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos)
      return {};  // "native", "all", "all-major": no list to check against
    a.arch = std::stoi(num);
    a.sass = kind != "virtual";
    a.ptx = kind != "real";
    out.push_back(a);
  }
  return out;
}

// The driver's choice for a device of compute capability cc: the newest SASS of the same major
// revision and a minor revision <= the device's (arch-specific SASS: exactly cc), else the newest
// PTX <= cc (arch-specific PTX: exactly cc), JIT-compiled. 0: none fits.
BuiltArch expected_image(const std::vector<BuiltArch>& archs, int cc) {
  BuiltArch best;
  for (const BuiltArch& a : archs) {
    const bool fits = a.specific ? a.arch == cc : (a.arch / 10 == cc / 10 && a.arch <= cc);
    if (a.sass && fits && a.arch >= best.arch) best = a;
  }
  if (best.arch) return best;
  for (const BuiltArch& a : archs) {
    const bool fits = a.specific ? a.arch == cc : a.arch <= cc;
    if (a.ptx && fits && a.arch >= best.arch) best = a;
  }
  return best;
}

TEST(Runtime, BuiltArchitecturesParse) {
  if (!lowbit::built_with_cuda()) GTEST_SKIP() << "built without CUDA";
  const auto archs = built_archs();
  if (archs.empty()) GTEST_SKIP() << "no architecture list: " << lowbit::build_info();
  for (const BuiltArch& a : archs) EXPECT_GE(a.arch, 50) << lowbit::build_info();
}

// The rule itself on hand-made lists.
TEST(Runtime, DriverRuleOnHandMadeLists) {
  EXPECT_EQ(expected_image({{80, false, true, true}, {89, false, true, true}}, 90).arch, 89);
  EXPECT_EQ(expected_image({{80, false, true, true}, {89, false, true, true}}, 86).arch, 80);
  EXPECT_EQ(expected_image({{90, true, true, true}}, 90).arch, 90);
  EXPECT_EQ(expected_image({{90, true, true, true}}, 89).arch, 0);
  EXPECT_EQ(expected_image({{90, true, true, true}}, 100).arch, 0);
  EXPECT_EQ(expected_image({{80, false, true, false}}, 90).arch, 0);  // 80-real: no PTX
}

// What cuda_device_info reports as the device code equals the driver's rule applied to the
// build's architecture list, and sm_90a code is reported exactly where the image is sm_90a's.
TEST(Runtime, DeviceCodeIsTheImageTheDriverPicks) {
  const int n = lowbit::cuda_device_count();
  if (n == 0) GTEST_SKIP() << "no CUDA device";
  const auto archs = built_archs();
  if (archs.empty()) GTEST_SKIP() << "no architecture list: " << lowbit::build_info();
  for (int i = 0; i < n; ++i) {
    const lowbit::DeviceInfo d = lowbit::cuda_device_info(i);
    const BuiltArch want = expected_image(archs, d.sm_major * 10 + d.sm_minor);
    EXPECT_EQ(d.code_arch, want.arch) << d.name << ", " << lowbit::build_info();
    EXPECT_EQ(d.code_sm90a, want.arch == 90 && want.specific)
        << d.name << ", " << lowbit::build_info();
  }
}

}  // namespace
