// safetensors reader (memory-mapped, validated) and streaming writer. See lowbit/checkpoint.h.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "lowbit/checkpoint.h"
#include "src/core/check.h"

namespace lowbit {

namespace {

constexpr const char* kOp = "safetensors";

struct DTypeEntry {
  FileDType dtype;
  const char* name;
  int size;
};
constexpr DTypeEntry kDTypes[] = {
    {FileDType::boolean, "BOOL", 1}, {FileDType::u8, "U8", 1},
    {FileDType::i8, "I8", 1},        {FileDType::e4m3, "F8_E4M3", 1},
    {FileDType::e5m2, "F8_E5M2", 1}, {FileDType::e8m0, "F8_E8M0", 1},
    {FileDType::i16, "I16", 2},      {FileDType::u16, "U16", 2},
    {FileDType::f16, "F16", 2},      {FileDType::bf16, "BF16", 2},
    {FileDType::i32, "I32", 4},      {FileDType::u32, "U32", 4},
    {FileDType::f32, "F32", 4},      {FileDType::i64, "I64", 8},
    {FileDType::u64, "U64", 8},      {FileDType::f64, "F64", 8},
};

[[noreturn]] void fail_file(const std::string& file, const std::string& message) {
  check::fail(kOp, file.c_str(), message);
}
[[noreturn]] void fail_tensor(const std::string& file, const std::string& tensor,
                              const std::string& message) {
  fail_file(file, "tensor '" + tensor + "': " + message);
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string sys_error() { return std::strerror(errno); }

// Non-negative integer from a JSON number (an unsigned, or a signed >= 0); false otherwise.
bool json_u64(const nlohmann::json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

// Reads one tensor entry of the header into `t` (t.name already set).
void parse_tensor_entry(const std::string& file, const nlohmann::json& e, TensorInfo& t) {
  const std::string& name = t.name;
  if (!e.is_object())
    fail_tensor(file, name, "expected a JSON object, got " + std::string(e.type_name()));
  for (auto it = e.begin(); it != e.end(); ++it) {
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      fail_tensor(file, name, "unexpected key '" + it.key() + "'");
  }
  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) fail_tensor(file, name, "missing string 'dtype'");
  const std::string dname = dt->get<std::string>();
  if (!parse_file_dtype(dname, &t.dtype)) {
    bool sub_byte = dname == "F4" || dname.rfind("F6_", 0) == 0;
    fail_tensor(file, name,
                "dtype '" + dname + "' is " +
                    (sub_byte ? "a sub-byte type lowbit does not read"
                              : "not a safetensors dtype lowbit knows"));
  }
  auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) fail_tensor(file, name, "missing array 'shape'");
  if (sh->size() > 64) fail_tensor(file, name, "rank " + std::to_string(sh->size()) + " above 64");
  uint64_t numel = 1;
  for (const auto& d : *sh) {
    uint64_t v = 0;
    if (!json_u64(d, &v) || v > static_cast<uint64_t>(INT64_MAX))
      fail_tensor(file, name, "shape entries must be non-negative integers, got " + d.dump());
    if (__builtin_mul_overflow(numel, v, &numel) || numel > static_cast<uint64_t>(INT64_MAX))
      fail_tensor(file, name, "shape " + sh->dump() + " overflows 64 bits");
    t.shape.push_back(static_cast<int64_t>(v));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(file_dtype_size(t.dtype)), &nbytes))
    fail_tensor(file, name, "size of shape " + sh->dump() + " overflows 64 bits");
  auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2 || !json_u64((*off)[0], &t.begin) ||
      !json_u64((*off)[1], &t.end))
    fail_tensor(file, name, "'data_offsets' must be two non-negative integers");
  if (t.end < t.begin)
    fail_tensor(file, name,
                "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                    "] end before begin");
  if (t.end - t.begin != nbytes)
    fail_tensor(file, name,
                "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                    "] hold " + std::to_string(t.end - t.begin) + " bytes, but " + dname +
                    " shape " + sh->dump() + " needs " + std::to_string(nbytes));
}

}  // namespace

// ---- dtypes ----------------------------------------------------------------------------------

const char* file_dtype_name(FileDType d) {
  for (const auto& e : kDTypes)
    if (e.dtype == d) return e.name;
  return "?";
}

int file_dtype_size(FileDType d) {
  for (const auto& e : kDTypes)
    if (e.dtype == d) return e.size;
  return 0;
}

bool parse_file_dtype(const std::string& name, FileDType* out) {
  for (const auto& e : kDTypes) {
    if (name == e.name) {
      *out = e.dtype;
      return true;
    }
  }
  return false;
}

bool file_dtype_to_dtype(FileDType d, DType* out) {
  switch (d) {
    case FileDType::f32:
      *out = DType::f32;
      return true;
    case FileDType::f16:
      *out = DType::f16;
      return true;
    case FileDType::bf16:
      *out = DType::bf16;
      return true;
    case FileDType::i8:
      *out = DType::i8;
      return true;
    case FileDType::u8:
      *out = DType::u8;
      return true;
    case FileDType::i32:
      *out = DType::i32;
      return true;
    case FileDType::e4m3:
      *out = DType::e4m3;
      return true;
    case FileDType::e5m2:
      *out = DType::e5m2;
      return true;
    default:
      return false;
  }
}

FileDType dtype_to_file_dtype(DType dt) {
  switch (dt) {
    case DType::f32:
      return FileDType::f32;
    case DType::f16:
      return FileDType::f16;
    case DType::bf16:
      return FileDType::bf16;
    case DType::i8:
      return FileDType::i8;
    case DType::u8:
      return FileDType::u8;
    case DType::i32:
      return FileDType::i32;
    case DType::e4m3:
      return FileDType::e4m3;
    case DType::e5m2:
      return FileDType::e5m2;
    case DType::e2m1x2:
    case DType::i4x2:
      return FileDType::u8;
  }
  return FileDType::u8;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t TensorSpec::nbytes() const {
  uint64_t n = static_cast<uint64_t>(file_dtype_size(dtype));
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// ---- reader ----------------------------------------------------------------------------------

struct SafetensorsReader::Impl {
  std::string path;
  const uint8_t* bytes = nullptr;
  uint64_t size = 0;
  void* mapping = nullptr;  // owned mapping (nullptr for from_memory)
  uint64_t header_bytes = 0;
  std::vector<TensorInfo> tensors;
  std::unordered_map<std::string, size_t> index;
  std::map<std::string, std::string> metadata;

  ~Impl() {
    if (mapping) munmap(mapping, size);
  }

  void parse(const ReaderOptions& options) {
    const std::string& f = path;
    if (size < 8)
      fail_file(
          f, "file of " + std::to_string(size) + " bytes is shorter than the 8-byte header length");
    header_bytes = read_u64_le(bytes);
    if (header_bytes > options.max_header_bytes)
      fail_file(f, "header length " + std::to_string(header_bytes) + " exceeds the limit of " +
                       std::to_string(options.max_header_bytes) + " bytes");
    if (header_bytes > size - 8)
      fail_file(f, "header length " + std::to_string(header_bytes) + " runs past the end of the " +
                       std::to_string(size) + "-byte file (truncated?)");
    if (header_bytes < 2 || bytes[8] != '{')
      fail_file(f, "header is not a JSON object (it must start with '{')");
    const char* hb = reinterpret_cast<const char*>(bytes + 8);

    // Parse, rejecting a key repeated within one object at any depth (nlohmann would silently
    // keep the last one; the reference library refuses such headers).
    std::vector<std::unordered_set<std::string>> keys;  // one set per open object
    std::string duplicate;
    int duplicate_depth = 0;
    using ev_t = nlohmann::json::parse_event_t;
    auto cb = [&](int depth, ev_t ev, nlohmann::json& parsed) {
      if (ev == ev_t::object_start) {
        keys.emplace_back();
      } else if (ev == ev_t::object_end) {
        if (!keys.empty()) keys.pop_back();
      } else if (ev == ev_t::key && !keys.empty() && duplicate.empty()) {
        std::string k = parsed.get<std::string>();
        if (!keys.back().insert(k).second) {
          duplicate = k;
          duplicate_depth = depth;
        }
      }
      return true;
    };
    nlohmann::json h;
    try {
      h = nlohmann::json::parse(hb, hb + header_bytes, cb);
    } catch (const nlohmann::json::exception& e) {
      fail_file(f, std::string("header is not valid JSON: ") + e.what());
    }
    if (!duplicate.empty()) {
      if (duplicate_depth == 1) fail_tensor(f, duplicate, "appears twice in the header");
      fail_file(f, "key '" + duplicate + "' appears twice in one object of the header");
    }
    if (!h.is_object()) fail_file(f, "header is not a JSON object");

    for (auto it = h.begin(); it != h.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it->is_object()) fail_file(f, "'__metadata__' must be an object of strings");
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (!m->is_string())
            fail_file(f, "'__metadata__' entry '" + m.key() + "' must be a string, got " +
                             std::string(m->type_name()));
          metadata[m.key()] = m->get<std::string>();
        }
        continue;
      }
      TensorInfo t;
      t.name = it.key();
      parse_tensor_entry(f, *it, t);
      tensors.push_back(std::move(t));
    }

    // The tensors must tile the data section: sorted by offset, no gap, no overlap, no tail.
    std::stable_sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    const uint64_t data_bytes = size - 8 - header_bytes;
    uint64_t pos = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorInfo& t = tensors[i];
      auto range = [](const TensorInfo& x) {
        return "[" + std::to_string(x.begin) + ", " + std::to_string(x.end) + ")";
      };
      if (t.begin < pos)
        fail_tensor(f, t.name,
                    "data_offsets " + range(t) + " overlap tensor '" + tensors[i - 1].name + "' " +
                        range(tensors[i - 1]));
      if (t.begin > pos)
        fail_tensor(f, t.name,
                    "data_offsets " + range(t) + " leave a gap of " +
                        std::to_string(t.begin - pos) + " bytes after offset " +
                        std::to_string(pos));
      if (t.end > data_bytes)
        fail_tensor(f, t.name,
                    "data_offsets " + range(t) + " run past the " + std::to_string(data_bytes) +
                        "-byte data section (file truncated?)");
      pos = t.end;
    }
    if (pos != data_bytes)
      fail_file(f, "data section holds " + std::to_string(data_bytes) + " bytes but the tensors " +
                       "cover " + std::to_string(pos) + " (trailing bytes)");
    for (size_t i = 0; i < tensors.size(); ++i) index[tensors[i].name] = i;
  }
};

SafetensorsReader::SafetensorsReader() : impl_(new Impl) {}

SafetensorsReader::SafetensorsReader(const std::string& path, const ReaderOptions& options)
    : impl_(new Impl) {
  impl_->path = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_file(path, "cannot open: " + sys_error());
  struct stat st;
  if (fstat(fd, &st) != 0) {
    std::string e = sys_error();
    ::close(fd);
    fail_file(path, "cannot stat: " + e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail_file(path, "not a regular file");
  }
  impl_->size = static_cast<uint64_t>(st.st_size);
  if (impl_->size >= 8) {
    void* m = mmap(nullptr, impl_->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      std::string e = sys_error();
      ::close(fd);
      fail_file(path, "cannot map: " + e);
    }
    impl_->mapping = m;
    impl_->bytes = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  impl_->parse(options);
}

SafetensorsReader SafetensorsReader::from_memory(const void* bytes, size_t size,
                                                 const std::string& label,
                                                 const ReaderOptions& options) {
  SafetensorsReader r;
  r.impl_->path = label;
  r.impl_->bytes = static_cast<const uint8_t*>(bytes);
  r.impl_->size = size;
  r.impl_->parse(options);
  return r;
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;
SafetensorsReader::~SafetensorsReader() = default;

const std::string& SafetensorsReader::path() const { return impl_->path; }
const std::vector<TensorInfo>& SafetensorsReader::tensors() const { return impl_->tensors; }
const std::map<std::string, std::string>& SafetensorsReader::metadata() const {
  return impl_->metadata;
}
uint64_t SafetensorsReader::file_bytes() const { return impl_->size; }
uint64_t SafetensorsReader::header_bytes() const { return impl_->header_bytes; }
uint64_t SafetensorsReader::data_offset() const { return 8 + impl_->header_bytes; }

const TensorInfo* SafetensorsReader::find(const std::string& name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? nullptr : &impl_->tensors[it->second];
}

const TensorInfo& SafetensorsReader::at(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) fail_tensor(impl_->path, name, "not in the file");
  return *t;
}

const uint8_t* SafetensorsReader::data(const TensorInfo& t) const {
  return impl_->bytes + data_offset() + t.begin;
}

TensorView SafetensorsReader::view(const TensorInfo& t) const {
  DType dt;
  if (!file_dtype_to_dtype(t.dtype, &dt))
    fail_tensor(impl_->path, t.name,
                std::string("dtype ") + file_dtype_name(t.dtype) + " has no lowbit tensor type");
  if (t.shape.size() > static_cast<size_t>(kMaxDims))
    fail_tensor(impl_->path, t.name,
                "rank " + std::to_string(t.shape.size()) + " above " + std::to_string(kMaxDims));
  return make_view(const_cast<uint8_t*>(data(t)), dt, static_cast<int>(t.shape.size()),
                   t.shape.data());
}

void SafetensorsReader::release(const TensorInfo& t) const { release(t, 0, t.nbytes()); }

void SafetensorsReader::release(const TensorInfo& t, uint64_t offset, uint64_t nbytes) const {
  if (!impl_->mapping || offset >= t.nbytes() || nbytes == 0) return;
  nbytes = std::min(nbytes, t.nbytes() - offset);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t lo = (data_offset() + t.begin + offset) / page * page;
  uint64_t hi =
      std::min(impl_->size, (data_offset() + t.begin + offset + nbytes + page - 1) / page * page);
  if (hi > lo) madvise(static_cast<uint8_t*>(impl_->mapping) + lo, hi - lo, MADV_DONTNEED);
}

// ---- writer ----------------------------------------------------------------------------------

namespace {

std::atomic<uint64_t> g_temp_counter{0};

void put_u64_le(uint64_t v, uint8_t* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

bool write_all(int fd, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorSpec> tensors,
                                     const std::map<std::string, std::string>& metadata,
                                     const WriterOptions& options)
    : path_(path), specs_(std::move(tensors)), options_(options) {
  const char* op = "safetensors_write";
  LOWBIT_CHECK(!path.empty(), op, "path", "expected a file name, got an empty string");
  std::unordered_set<std::string> names;
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& kv : metadata) m[kv.first] = kv.second;
    h["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const TensorSpec& s : specs_) {
    LOWBIT_CHECK(!s.name.empty(), op, path.c_str(), "tensor names must not be empty");
    LOWBIT_CHECK(s.name != "__metadata__", op, path.c_str(),
                 "'__metadata__' is reserved, not a tensor name");
    LOWBIT_CHECK(names.insert(s.name).second, op, path.c_str(),
                 "tensor '" + s.name + "' planned twice");
    uint64_t n = static_cast<uint64_t>(file_dtype_size(s.dtype));
    for (int64_t d : s.shape) {
      LOWBIT_CHECK(d >= 0, op, path.c_str(),
                   "tensor '" + s.name + "': negative dimension " + std::to_string(d));
      LOWBIT_CHECK(!__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n), op, path.c_str(),
                   "tensor '" + s.name + "': size overflows 64 bits");
    }
    nlohmann::ordered_json e;
    e["dtype"] = file_dtype_name(s.dtype);
    e["shape"] = s.shape;
    e["data_offsets"] = {offset, offset + n};
    h[s.name] = std::move(e);
    LOWBIT_CHECK(!__builtin_add_overflow(offset, n, &offset), op, path.c_str(),
                 "total size overflows 64 bits");
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');

  // Temporary file beside the destination, so the final rename stays on one file system.
  std::string dir = ".", base = path;
  size_t slash = path.rfind('/');
  if (slash != std::string::npos) {
    dir = slash == 0 ? "/" : path.substr(0, slash);
    base = path.substr(slash + 1);
  }
  LOWBIT_CHECK(!base.empty(), op, path.c_str(), "expected a file name, got a directory");
  temp_path_ = (dir == "/" ? "" : dir) + "/." + base + ".tmp-" + std::to_string(getpid()) + "-" +
               std::to_string(g_temp_counter.fetch_add(1));
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd_ < 0)
    check::fail(op, path.c_str(),
                "cannot create temporary file " + temp_path_ + ": " + sys_error());
  uint8_t len[8];
  put_u64_le(header.size(), len);
  if (!write_all(fd_, len, 8) || !write_all(fd_, header.data(), header.size()))
    fail("cannot write the header: " + sys_error());
}

SafetensorsWriter::~SafetensorsWriter() { abandon(); }

void SafetensorsWriter::abandon() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!finished_ && !temp_path_.empty()) {
    ::unlink(temp_path_.c_str());
    temp_path_.clear();
    closed_ = false;
  }
}

void SafetensorsWriter::fail(const std::string& what) {
  abandon();
  check::fail("safetensors_write", path_.c_str(), what);
}

void SafetensorsWriter::write(const std::string& name, const void* bytes, size_t nbytes) {
  if (fd_ < 0) fail("tensor '" + name + "': the writer is finished or abandoned");
  // A zero-sized tensor needs no write; skip over completed ones to the next in the plan.
  while (current_ < specs_.size() && written_ == specs_[current_].nbytes() &&
         specs_[current_].name != name) {
    ++current_;
    written_ = 0;
  }
  if (current_ >= specs_.size()) fail("tensor '" + name + "': all planned tensors are written");
  const TensorSpec& s = specs_[current_];
  if (s.name != name)
    fail("tensor '" + name + "': expected tensor '" + s.name + "' next (the planned order)");
  if (written_ + nbytes > s.nbytes())
    fail("tensor '" + name + "': " + std::to_string(written_ + nbytes) + " bytes written, " +
         "the plan holds " + std::to_string(s.nbytes()));
  if (nbytes > 0 && !write_all(fd_, bytes, nbytes))
    fail("tensor '" + name + "': write failed: " + sys_error());
  written_ += nbytes;
}

void SafetensorsWriter::finish() {
  close();
  commit();
}

void SafetensorsWriter::close() {
  if (fd_ < 0) fail("finish: the writer is finished or abandoned");
  while (current_ < specs_.size() && written_ == specs_[current_].nbytes()) {
    ++current_;
    written_ = 0;
  }
  if (current_ < specs_.size())
    fail("finish: tensor '" + specs_[current_].name + "' has " + std::to_string(written_) +
         " of its " + std::to_string(specs_[current_].nbytes()) + " bytes");
  if (options_.fsync && ::fsync(fd_) != 0) fail("fsync failed: " + sys_error());
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail("close failed: " + sys_error());
  }
  fd_ = -1;
  closed_ = true;
}

void SafetensorsWriter::commit() {
  if (!closed_ || finished_) fail("commit: the writer is not closed, or already committed");
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0)
    fail("cannot rename " + temp_path_ + " onto it: " + sys_error());
  finished_ = true;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace lowbit
