// Registers every harness case as two GoogleTest tests: <case>/cpu and <case>/cuda.
// The cuda test skips visibly (GTEST_SKIP with the reason) where there is no GPU.
#include <gtest/gtest.h>

#include "tests/harness/harness.h"

namespace {

class HarnessTest : public testing::Test {
 public:
  HarnessTest(const lowbit::harness::Case* c, lowbit::Device d) : case_(c), device_(d) {}
  void TestBody() override {
    lowbit::harness::Result r = lowbit::harness::run_case(*case_, device_);
    if (r.status == lowbit::harness::Status::skip) GTEST_SKIP() << r.message;
    EXPECT_EQ(r.status, lowbit::harness::Status::pass) << r.message;
  }

 private:
  const lowbit::harness::Case* case_;
  lowbit::Device device_;
};

}  // namespace

int main(int argc, char** argv) {
  for (auto& c : lowbit::harness::registry()) {
    const lowbit::harness::Case* cp = c.get();
    for (lowbit::Device d : {lowbit::Device::cpu, lowbit::Device::cuda}) {
      std::string suite = "harness." + std::string(lowbit::device_name(d));
      testing::RegisterTest(suite.c_str(), cp->name().c_str(), nullptr, nullptr, __FILE__, __LINE__,
                            [cp, d]() -> testing::Test* { return new HarnessTest(cp, d); });
    }
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
