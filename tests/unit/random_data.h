// Seeded N(0, sd) data shared by the unit tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace lowbit {
namespace testing_data {

inline std::vector<float> normal_vec(size_t n, uint64_t seed, float sd = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace testing_data
}  // namespace lowbit
