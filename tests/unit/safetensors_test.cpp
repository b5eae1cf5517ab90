// safetensors reader and writer: hand-built files (every byte written here), each malformed case,
// and writer round trips / failure paths.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tests/unit/temp_files.h"
#include "lowbit/checkpoint.h"

namespace lowbit {
namespace {

// An 8-byte little-endian length, the header text, then the data bytes.
std::vector<uint8_t> make_file(const std::string& header, const std::vector<uint8_t>& data,
                               int64_t claimed_len = -1) {
  uint64_t n = claimed_len >= 0 ? static_cast<uint64_t>(claimed_len) : header.size();
  std::vector<uint8_t> f;
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<uint8_t>(n >> (8 * i)));
  f.insert(f.end(), header.begin(), header.end());
  f.insert(f.end(), data.begin(), data.end());
  return f;
}

std::vector<uint8_t> bytes_n(size_t n) {
  std::vector<uint8_t> d(n);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint8_t>(i * 7 + 1);
  return d;
}

// Expects parsing to fail with a message containing every piece of `parts`.
void expect_bad(const std::vector<uint8_t>& file, std::initializer_list<const char*> parts,
                const ReaderOptions& opt = {}) {
  try {
    SafetensorsReader::from_memory(file.data(), file.size(), "bad.safetensors", opt);
    ADD_FAILURE() << "parsed without error; expected: " << *parts.begin();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
    for (const char* p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "want '" << p << "' in: " << msg;
  }
}

std::string tmp_dir(const std::string& name) { return testing_files::tmp_dir("lowbit_st_", name); }
using testing_files::list_dir;

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
}

TEST(Safetensors, ReadsHandBuiltFile) {
  // Listed out of offset order in the JSON on purpose: the reader orders by offset.
  std::string h = R"({"b":{"dtype":"BF16","shape":[3],"data_offsets":[24,30]},)"
                  R"("__metadata__":{"format":"pt","k":"v"},)"
                  R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                  R"("s":{"dtype":"I64","shape":[],"data_offsets":[30,38]},)"
                  R"("z":{"dtype":"U8","shape":[0,5],"data_offsets":[38,38]}}  )";
  std::vector<uint8_t> data;
  float a[6] = {1.f, -2.f, 3.5f, 0.f, 1e-3f, -7.25f};
  data.insert(data.end(), reinterpret_cast<uint8_t*>(a), reinterpret_cast<uint8_t*>(a) + 24);
  for (uint8_t b : {0x80, 0x3f, 0x00, 0xc0, 0x49, 0x40}) data.push_back(b);  // bf16 1, -2, 3.14
  for (int i = 0; i < 8; ++i) data.push_back(i == 0 ? 42 : 0);
  auto f = make_file(h, data);
  auto r = SafetensorsReader::from_memory(f.data(), f.size(), "hand.safetensors");
  ASSERT_EQ(r.tensors().size(), 4u);
  EXPECT_EQ(r.tensors()[0].name, "a");
  EXPECT_EQ(r.tensors()[1].name, "b");
  EXPECT_EQ(r.tensors()[2].name, "s");
  EXPECT_EQ(r.tensors()[3].name, "z");
  EXPECT_EQ(r.header_bytes(), h.size());
  EXPECT_EQ(r.data_offset(), 8 + h.size());
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("k"), "v");
  const TensorInfo& ta = r.at("a");
  EXPECT_EQ(ta.dtype, FileDType::f32);
  EXPECT_EQ(ta.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta.numel(), 6);
  TensorView va = r.view(ta);
  EXPECT_EQ(va.dtype, DType::f32);
  EXPECT_EQ(va.ndim, 2);
  float got[6];
  std::memcpy(got, va.data, 24);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got[i], a[i]);
  const TensorInfo& tb = r.at("b");
  EXPECT_EQ(tb.dtype, FileDType::bf16);
  EXPECT_EQ(r.data(tb)[0], 0x80);
  EXPECT_EQ(r.data(tb)[1], 0x3f);
  EXPECT_EQ(r.at("s").shape.size(), 0u);
  EXPECT_EQ(r.at("s").numel(), 1);
  EXPECT_EQ(r.data(r.at("s"))[0], 42);
  EXPECT_EQ(r.at("z").numel(), 0);
  EXPECT_EQ(r.find("nope"), nullptr);
  EXPECT_THROW(r.at("nope"), Error);
  // I64 has no lowbit DType: view() refuses, naming the tensor.
  try {
    r.view(r.at("s"));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'s'"), std::string::npos);
  }
}

TEST(Safetensors, EveryDTypeName) {
  struct {
    const char* name;
    int size;
  } cases[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
               {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
               {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8}};
  for (const auto& c : cases) {
    std::string h = std::string(R"({"t":{"dtype":")") + c.name +
                    R"(","shape":[3],"data_offsets":[0,)" + std::to_string(3 * c.size) + "]}}";
    auto f = make_file(h, bytes_n(3 * c.size));
    auto r = SafetensorsReader::from_memory(f.data(), f.size(), "x");
    EXPECT_STREQ(file_dtype_name(r.at("t").dtype), c.name);
    EXPECT_EQ(file_dtype_size(r.at("t").dtype), c.size);
  }
}

TEST(Safetensors, RejectsShortAndTruncatedFiles) {
  expect_bad({}, {"shorter than the 8-byte header length"});
  expect_bad({1, 0, 0}, {"shorter than the 8-byte header length"});
  // Header length claims more bytes than the file has.
  expect_bad(make_file("{}", {}, 100), {"header length 100", "runs past the end"});
  // Data truncated: the tensor needs 24 bytes, 20 are there.
  std::string h = R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";
  expect_bad(make_file(h, bytes_n(20)), {"tensor 'a'", "run past", "truncated"});
}

TEST(Safetensors, RejectsOversizedHeader) {
  std::string h = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  ReaderOptions opt;
  opt.max_header_bytes = 16;
  expect_bad(make_file(h, bytes_n(1)), {"exceeds the limit of 16"}, opt);
  // An absurd length (2^63) is rejected by the limit before anything else.
  std::vector<uint8_t> f = {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'};
  expect_bad(f, {"exceeds the limit"});
}

TEST(Safetensors, RejectsMalformedJson) {
  expect_bad(make_file("[1,2]", {}), {"must start with '{'"});
  expect_bad(make_file("{\"a\":", {}), {"not valid JSON"});
  expect_bad(make_file("{\"a\":1} trailing", {}), {"not valid JSON"});
  expect_bad(make_file(R"({"a":[1]})", {}), {"tensor 'a'", "JSON object"});
  expect_bad(make_file(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", bytes_n(1)),
             {"tensor 'a'", "missing string 'dtype'"});
  expect_bad(make_file(R"({"a":{"dtype":"U8","data_offsets":[0,1]}})", bytes_n(1)),
             {"tensor 'a'", "missing array 'shape'"});
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":[1]}})", bytes_n(1)),
             {"tensor 'a'", "data_offsets"});
  expect_bad(
      make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", bytes_n(1)),
      {"tensor 'a'", "unexpected key 'x'"});
}

TEST(Safetensors, RejectsBadDTypesAndShapes) {
  expect_bad(make_file(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", bytes_n(1)),
             {"tensor 'a'", "'Q7'"});
  expect_bad(make_file(R"({"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", bytes_n(1)),
             {"tensor 'a'", "sub-byte"});
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", bytes_n(1)),
             {"tensor 'a'", "non-negative integers"});
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", bytes_n(1)),
             {"tensor 'a'", "non-negative integers"});
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":["1"],"data_offsets":[0,1]}})", bytes_n(1)),
             {"tensor 'a'", "non-negative integers"});
  // 2^32 * 2^32 elements overflow 64 bits.
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],)"
                       R"("data_offsets":[0,1]}})",
                       bytes_n(1)),
             {"tensor 'a'", "overflows"});
  // numel fits, numel * 8 bytes does not.
  expect_bad(make_file(R"({"a":{"dtype":"F64","shape":[4611686018427387904],)"
                       R"("data_offsets":[0,1]}})",
                       bytes_n(1)),
             {"tensor 'a'", "overflows"});
}

TEST(Safetensors, RejectsBadOffsets) {
  // Size mismatch: F32 (2) needs 8 bytes.
  expect_bad(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,6]}})", bytes_n(6)),
             {"tensor 'a'", "hold 6 bytes", "needs 8"});
  // end before begin.
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[5,4]}})", bytes_n(5)),
             {"tensor 'a'", "end before begin"});
  // Negative offset.
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", bytes_n(1)),
             {"tensor 'a'", "non-negative"});
  // Three offsets.
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", bytes_n(2)),
             {"tensor 'a'", "two non-negative integers"});
  // Overlap: b starts inside a.
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                       R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                       bytes_n(6)),
             {"tensor 'b'", "overlap tensor 'a'"});
  // Two tensors on the same bytes.
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                       R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                       bytes_n(4)),
             {"overlap"});
  // Gap between tensors.
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                       R"("b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
                       bytes_n(5)),
             {"tensor 'b'", "gap of 1 bytes"});
  // Gap at the start.
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", bytes_n(3)),
             {"tensor 'a'", "gap"});
  // Trailing bytes after the last tensor.
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", bytes_n(3)),
             {"trailing bytes"});
  // Offsets near 2^64 do not wrap around.
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":[1],)"
                       R"("data_offsets":[18446744073709551615,0]}})",
                       bytes_n(1)),
             {"tensor 'a'"});
}

TEST(Safetensors, RejectsDuplicatesAndBadMetadata) {
  expect_bad(make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                       bytes_n(2)),
             {"tensor 'a'", "appears twice"});
  expect_bad(make_file(R"({"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})",
                       bytes_n(1)),
             {"key 'dtype' appears twice"});
  expect_bad(make_file(R"({"__metadata__":{"k":"1","k":"2"}})", {}), {"key 'k' appears twice"});
  // The same key in two different objects is fine.
  auto ok = make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                      R"("b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                      bytes_n(2));
  EXPECT_EQ(SafetensorsReader::from_memory(ok.data(), ok.size(), "x").tensors().size(), 2u);
  expect_bad(make_file(R"({"__metadata__":{"n":1}})", {}), {"'__metadata__' entry 'n'", "string"});
  expect_bad(make_file(R"({"__metadata__":[1]})", {}), {"'__metadata__' must be an object"});
}

TEST(Safetensors, EmptyFileWithOnlyMetadata) {
  auto f = make_file(R"({"__metadata__":{"a":"b"}})", {});
  auto r = SafetensorsReader::from_memory(f.data(), f.size(), "x");
  EXPECT_TRUE(r.tensors().empty());
  EXPECT_EQ(r.metadata().at("a"), "b");
}

TEST(SafetensorsWriter, RoundTripAndExactBytes) {
  std::string dir = tmp_dir("RoundTripAndExactBytes");
  std::string path = dir + "/rt.safetensors";
  std::vector<TensorSpec> plan = {
      {"w", FileDType::f32, {2, 2}}, {"empty", FileDType::bf16, {0}}, {"b", FileDType::i8, {3}}};
  {
    SafetensorsWriter w(path, plan, {{"m", "x"}});
    float wv[4] = {1.f, 2.f, 3.f, 4.f};
    w.write("w", wv, 8);  // in two chunks
    w.write("w", wv + 2, 8);
    int8_t bv[3] = {-1, 0, 5};
    w.write("b", bv, 3);  // "empty" needs no write
    w.finish();
  }
  // The exact bytes: compact JSON header, padded with spaces to a multiple of 8.
  std::string h =
      R"({"__metadata__":{"m":"x"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("empty":{"dtype":"BF16","shape":[0],"data_offsets":[16,16]},)"
      R"("b":{"dtype":"I8","shape":[3],"data_offsets":[16,19]}})";
  h.append((8 - h.size() % 8) % 8, ' ');
  std::vector<uint8_t> data;
  for (float v : {1.f, 2.f, 3.f, 4.f}) {
    uint8_t b[4];
    std::memcpy(b, &v, 4);
    data.insert(data.end(), b, b + 4);
  }
  for (int8_t v : {-1, 0, 5}) data.push_back(static_cast<uint8_t>(v));
  EXPECT_EQ(read_all(path), make_file(h, data));
  SafetensorsReader r(path);
  EXPECT_EQ(r.tensors().size(), 3u);
  EXPECT_EQ(r.data_offset() % 8, 0u);
  EXPECT_EQ(r.metadata().at("m"), "x");
  EXPECT_EQ(static_cast<int8_t>(r.data(r.at("b"))[0]), -1);
  r.release(r.at("w"));           // pages dropped, data still readable
  r.release(r.at("w"), 4, 1000);  // a range, clamped to the tensor
  r.release(r.at("w"), 99, 1);    // past the end: nothing
  float w1;
  std::memcpy(&w1, r.data(r.at("w")) + 4, 4);
  EXPECT_EQ(w1, 2.f);
  // Only the output remains in the directory: no temporary file.
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"rt.safetensors"});
  std::remove(path.c_str());
}

TEST(SafetensorsWriter, FailuresLeaveNoFile) {
  std::string dir = tmp_dir("FailuresLeaveNoFile");
  std::string path = dir + "/fail.safetensors";
  std::vector<TensorSpec> plan = {{"a", FileDType::u8, {4}}, {"b", FileDType::u8, {2}}};
  uint8_t buf[8] = {};
  {  // Wrong order.
    SafetensorsWriter w(path, plan, {});
    EXPECT_THROW(w.write("b", buf, 2), Error);
  }
  {  // Too many bytes.
    SafetensorsWriter w(path, plan, {});
    EXPECT_THROW(w.write("a", buf, 5), Error);
  }
  {  // finish() with a tensor missing.
    SafetensorsWriter w(path, plan, {});
    w.write("a", buf, 4);
    try {
      w.finish();
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tensor 'b' has 0 of its 2 bytes"), std::string::npos)
          << e.what();
    }
  }
  {  // Destroyed before finish (an interrupted run).
    SafetensorsWriter w(path, plan, {});
    w.write("a", buf, 4);
    EXPECT_FALSE(list_dir(dir).empty());  // the temporary file exists meanwhile
  }
  EXPECT_TRUE(list_dir(dir).empty());
  // Bad plans are refused before any file is created.
  EXPECT_THROW(SafetensorsWriter(path, {{"a", FileDType::u8, {1}}, {"a", FileDType::u8, {1}}}, {}),
               Error);
  EXPECT_THROW(SafetensorsWriter(path, {{"__metadata__", FileDType::u8, {1}}}, {}), Error);
  EXPECT_THROW(SafetensorsWriter(path, {{"", FileDType::u8, {1}}}, {}), Error);
  EXPECT_THROW(SafetensorsWriter(path, {{"n", FileDType::u8, {-2}}}, {}), Error);
  EXPECT_THROW(SafetensorsWriter(dir + "/no/such/dir/x.safetensors", plan, {}), Error);
  EXPECT_TRUE(list_dir(dir).empty());
}

TEST(SafetensorsWriter, FailedRunKeepsExistingOutput) {
  std::string dir = tmp_dir("FailedRunKeepsExistingOutput");
  std::string path = dir + "/keep.safetensors";
  {
    std::ofstream f(path, std::ios::binary);
    f << "old";
  }
  {
    SafetensorsWriter w(path, {{"a", FileDType::u8, {4}}}, {});
    uint8_t b[2] = {};
    w.write("a", b, 2);
  }  // abandoned
  auto got = read_all(path);
  EXPECT_EQ(std::string(got.begin(), got.end()), "old");
  EXPECT_TRUE(same_file(path, path));
  EXPECT_FALSE(same_file(path, dir + "/missing"));
  std::remove(path.c_str());
}

TEST(SafetensorsReader, FileErrorsNameThePath) {
  std::string dir = tmp_dir("FileErrorsNameThePath");
  try {
    SafetensorsReader r(dir + "/missing.safetensors");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.safetensors"), std::string::npos);
  }
  std::string p = dir + "/short.safetensors";
  {
    std::ofstream f(p, std::ios::binary);
    f << "abc";
  }
  EXPECT_THROW(SafetensorsReader r(p), Error);
  EXPECT_THROW(SafetensorsReader r(dir), Error);  // a directory
  std::remove(p.c_str());
}

}  // namespace
}  // namespace lowbit
