// Checkpoints (SPEC §3.6): a memory-mapped safetensors reader, a streaming safetensors writer,
// sharded checkpoints, the model quantizer behind `lowbit quantize` and its inverse behind
// `lowbit dequantize`.
//
// safetensors layout: an 8-byte little-endian header length N, N bytes of JSON (an object of
// tensor name -> {"dtype", "shape", "data_offsets": [begin, end]} plus an optional
// "__metadata__" object of string -> string), then the data section; offsets are relative to
// the start of the data section. The reader validates every byte it will hand out before it
// hands anything out: a malformed file is a lowbit::Error naming the file and the tensor.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lowbit/linear.h"
#include "lowbit/tensor.h"

namespace lowbit {

// ---- safetensors dtypes -------------------------------------------------------------------
// Every dtype of the safetensors format with a whole number of bytes per element. (The sub-byte
// F4/F6 types of newer writers are rejected with an error naming them.)
enum class FileDType : uint8_t {
  boolean,  // "BOOL"
  u8,       // "U8"
  i8,       // "I8"
  e4m3,     // "F8_E4M3"
  e5m2,     // "F8_E5M2"
  e8m0,     // "F8_E8M0" (exponent-only scale type)
  i16,      // "I16"
  u16,      // "U16"
  f16,      // "F16"
  bf16,     // "BF16"
  i32,      // "I32"
  u32,      // "U32"
  f32,      // "F32"
  i64,      // "I64"
  u64,      // "U64"
  f64,      // "F64"
};

// "F32", "BF16", ... (the spelling of the file format).
const char* file_dtype_name(FileDType);
// Bytes per element.
int file_dtype_size(FileDType);
// Parses a file dtype name; returns false when `name` is not one lowbit reads.
bool parse_file_dtype(const std::string& name, FileDType* out);
// The lowbit DType with the same bits, if there is one (f32, f16, bf16, i8, u8, i32, e4m3,
// e5m2); returns false otherwise.
bool file_dtype_to_dtype(FileDType, DType* out);
// The file dtype that stores `dt` element by element (packed 4-bit types are stored as U8).
FileDType dtype_to_file_dtype(DType dt);

// One tensor of a safetensors file.
struct TensorInfo {
  std::string name;
  FileDType dtype = FileDType::f32;
  std::vector<int64_t> shape;  // any rank, [] for a scalar
  uint64_t begin = 0;          // byte offsets [begin, end) in the data section
  uint64_t end = 0;
  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

struct ReaderOptions {
  // Headers above this many bytes are rejected (the safetensors reference library uses 100 MB).
  uint64_t max_header_bytes = 100000000;
};

// A validated, read-only, memory-mapped safetensors file. Opening it checks the whole header:
// the header length against the file size and max_header_bytes; the JSON (an object whose
// entries are tensors, with no duplicate names, plus an optional "__metadata__" of strings);
// each tensor's dtype, shape (non-negative, no overflow) and data_offsets (begin <= end,
// end - begin == numel * element size); and that the tensors tile the data section exactly
// (sorted by offset: no gap, no overlap, nothing after the last one). Any violation throws
// lowbit::Error("safetensors", path, "tensor 'name': ..."). After that every pointer the reader
// hands out is in bounds.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path, const ReaderOptions& options = {});
  // Parses and validates a file image already in memory (not copied: `bytes` must outlive the
  // reader). `label` names it in errors. Used by the fuzz target and by tests.
  static SafetensorsReader from_memory(const void* bytes, size_t size, const std::string& label,
                                       const ReaderOptions& options = {});
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;
  ~SafetensorsReader();

  const std::string& path() const;
  // Tensors in data-section order.
  const std::vector<TensorInfo>& tensors() const;
  // nullptr when there is no tensor of that name.
  const TensorInfo* find(const std::string& name) const;
  // Throws lowbit::Error naming the file when there is no tensor of that name.
  const TensorInfo& at(const std::string& name) const;
  // The "__metadata__" entries (empty when the file has none).
  const std::map<std::string, std::string>& metadata() const;
  uint64_t file_bytes() const;
  uint64_t header_bytes() const;  // N, the JSON length
  uint64_t data_offset() const;   // 8 + N

  // The tensor's bytes inside the mapping (nbytes() of them; not necessarily aligned).
  const uint8_t* data(const TensorInfo&) const;
  // A contiguous view of the tensor (throws when its dtype has no lowbit DType or its rank is
  // above kMaxDims). The data pointer may be unaligned for the element type.
  TensorView view(const TensorInfo&) const;
  // Tells the OS the tensor's pages are no longer needed, so a streaming pass over a large file
  // keeps its resident memory at about one tensor. The data stays readable (it is paged back in).
  void release(const TensorInfo&) const;
  // The same for bytes [offset, offset + nbytes) of the tensor (clamped to it).
  void release(const TensorInfo&, uint64_t offset, uint64_t nbytes) const;

 private:
  SafetensorsReader();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One tensor of a file to be written.
struct TensorSpec {
  std::string name;
  FileDType dtype = FileDType::f32;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};

struct WriterOptions {
  bool fsync = true;  // flush the temporary file to disk before the rename
};

// Streams a safetensors file: the constructor validates the plan (unique non-empty names, not
// "__metadata__", sizes without overflow), computes every offset and writes the header (padded
// with spaces to a multiple of 8 bytes, so the data section starts 8-byte aligned) to a
// temporary file in the destination's directory. write() then takes the tensors one at a time,
// in the planned order, each in one or more chunks; finish() checks that everything was
// written, flushes and renames the temporary file onto `path` (atomic on POSIX). A writer
// destroyed before finish() (an error, an exception, a cancelled run) removes its temporary
// file, so `path` never holds a partial file.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<TensorSpec> tensors,
                    const std::map<std::string, std::string>& metadata,
                    const WriterOptions& options = {});
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();

  // Appends `nbytes` bytes of tensor `name`, which must be the tensor being written (the next in
  // the plan, or the one whose earlier chunks were written); a tensor's chunks must add up to
  // exactly its size. Throws lowbit::Error otherwise (and the output is abandoned).
  void write(const std::string& name, const void* bytes, size_t nbytes);
  // close() + commit().
  void finish();
  // The two halves of finish(), for outputs of several files that appear together (a sharded
  // checkpoint: every shard is closed before the first is committed). close() checks that
  // everything was written, flushes and closes the temporary file; commit() renames it onto
  // `path`. A writer closed but not committed still removes its temporary file when abandoned
  // or destroyed.
  void close();
  void commit();
  // Removes the temporary file now (the destructor does it too).
  void abandon();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  const std::vector<TensorSpec>& tensors() const { return specs_; }

 private:
  void fail(const std::string& what);
  std::string path_, temp_path_;
  std::vector<TensorSpec> specs_;
  WriterOptions options_;
  int fd_ = -1;
  size_t current_ = 0;    // index of the tensor being written
  uint64_t written_ = 0;  // bytes of it written so far
  bool closed_ = false;   // close() succeeded (the temporary file is complete)
  bool finished_ = false;
};

// ---- sharded checkpoints --------------------------------------------------------------------
// A checkpoint split over several safetensors files by an index, the convention of Hugging Face's
// save_pretrained and diffusers ("model.safetensors.index.json",
// "diffusion_pytorch_model.safetensors.index.json"): a JSON object {"metadata": {"total_size":
// bytes, ...}, "weight_map": {tensor name: shard file name}} with the shards in the index's
// directory.
struct CheckpointFiles {
  std::string index;               // the index file; empty for a single safetensors file
  std::vector<std::string> files;  // the safetensors files: the shards (sorted by name) or one
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name (index only)
  std::string index_metadata;  // the index's "metadata" object as JSON text ("{}" if absent)
};

// True when `path` names an index (its name ends in ".index.json").
bool is_checkpoint_index(const std::string& path);

// Resolves a checkpoint path: a safetensors file (itself), an index (its shards: the index must
// be a JSON object whose "weight_map" maps non-empty tensor names to plain file names ending in
// ".safetensors" (no '/', no NUL, not starting with '.'), with an optional "metadata" object),
// or a directory holding exactly one "*.safetensors.index.json" (that index) or, without one,
// exactly one "*.safetensors" file. The shards are not opened here. Errors name the path and the
// entry.
CheckpointFiles checkpoint_files(const std::string& path);

// Opens the files of a checkpoint, in the order of `files.files`, and checks an index against
// its shards: every tensor of the weight map is in the shard it names, every tensor of a shard
// is in the weight map under that shard, and no name is in two files.
std::vector<SafetensorsReader> open_checkpoint(const CheckpointFiles& files,
                                               const ReaderOptions& options = {});

// A quantized layer found in a file: the per-layer marker tensor `{prefix}lowbit_quant` (lowbit
// format, docs/checkpoint-format.md) or `{prefix}comfy_quant` (ComfyUI), a 1-D U8 tensor holding
// the bytes of a JSON object.
struct LayerMarker {
  std::string prefix;  // "blocks.0.attn.qkv." (the marker name minus "lowbit_quant"/"comfy_quant")
  std::string format;  // "lowbit" or "comfy"
  std::string qtype;   // "convrot8", ...; comfy "convrot_w4a4" reads as "convrotcomfyw4a4"
  int rot = 0;         // rotation block (0 when the marker does not say)
  int bits = 0;        // weight bits (0 when the marker does not say)
  int group = 0;       // scale group along K (0 = one scale per row)
  std::string json;    // the marker's JSON text
};
// Every marker of the file, in data order. A marker that is not a 1-D U8 tensor holding a JSON
// object with a string "format" (comfy) or "qtype" (lowbit) is a lowbit::Error naming it.
std::vector<LayerMarker> find_layer_markers(const SafetensorsReader& file);

// True when both paths name the same existing file (same device and inode).
bool same_file(const std::string& a, const std::string& b);

// The JSON text of a layer's `{prefix}lowbit_quant` marker (lowbit format): qtype, rot, bits,
// group, out_features, in_features, the quantized tensor's file dtype (`source`), version 1.
std::string lowbit_marker_json(const PackedWeight& w, FileDType source);

// Loads the packed weight of one quantized layer of `file` (lowbit or comfy format), validating
// every part against the marker's qtype and the layer's shape. Host memory.
PackedWeight load_quantized_layer(const SafetensorsReader& file, const LayerMarker& marker);

// ---- the model quantizer (`lowbit quantize`) ------------------------------------------------

enum class CheckpointFormat : uint8_t {
  lowbit,  // every qtype; parts and a {p}lowbit_quant marker (docs/checkpoint-format.md)
  comfy,   // ComfyUI convrot_w4a4 (SPEC §3.6); convrotcomfyw4a4 only
};

// Which 2-D "*.weight" tensors to quantize, by glob (fnmatch(3), '*' also matches '.') on the
// tensor name. An empty include list means all.
struct QuantizeFilter {
  std::vector<std::string> include;
  std::vector<std::string> exclude;
};

struct QuantizeProgress {
  size_t index = 0;                          // tensors done so far (0 .. count)
  size_t count = 0;                          // tensors of the input
  std::string name;                          // the tensor just done ("" for the first call)
  uint64_t bytes_done = 0, bytes_total = 0;  // input data bytes
};
using ProgressFn = std::function<void(const QuantizeProgress&)>;

struct QuantizeOptions {
  QuantizeFilter filter;
  CheckpointFormat format = CheckpointFormat::lowbit;
  bool compute_error = true;  // ||W - deq(Q(W))|| / ||W|| per layer (costs one dequantization)
  // Plan only: the report's decisions and sizes (no rel_error, no files_out), nothing written
  // and no weight read (what --include / --exclude select on a large model, in a second).
  bool dry_run = false;
  ProgressFn progress;        // called once before the first tensor and after each tensor
  // Checked before each tensor: when set, the run stops with a lowbit::Error and leaves no
  // output file (a CLI sets it from SIGINT).
  const std::atomic<bool>* cancel = nullptr;
  WriterOptions writer;
};

// One linear-weight candidate (a 2-D tensor named "weight" or "*.weight").
struct LayerReport {
  std::string name;            // the weight tensor's name
  std::vector<int64_t> shape;  // (O, K)
  std::string source_dtype;    // "BF16", ...
  bool quantized = false;
  std::string qtype;        // when quantized
  std::string skip_reason;  // when not
  int rot = 0;
  uint64_t bytes_before = 0;  // the weight tensor
  uint64_t bytes_after = 0;   // every tensor written for it (marker included); = before if skipped
  double rel_error = -1;      // ||W - deq(Q(W))||_F / ||W||_F in fp64; -1 when not computed
};

// What a checkpoint transform (quantize_checkpoint, dequantize_checkpoint) read and wrote.
struct CheckpointIO {
  std::vector<std::string> files_in, files_out;  // the safetensors files read / written
  std::string index_out;                         // the index written (sharded output only)
  size_t tensors_in = 0, tensors_out = 0;
  uint64_t file_bytes_in = 0, file_bytes_out = 0;
};

struct QuantizeReport : CheckpointIO {
  std::vector<LayerReport> layers;  // in file order (shard after shard)
  size_t tensors_copied = 0;
  uint64_t data_bytes_in = 0, data_bytes_out = 0;
  size_t quantized() const;
  size_t skipped() const;
};

// Streams `in` to `out`, quantizing every 2-D "*.weight" tensor (f32/bf16/f16) that passes the
// filter, is not an embedding (a name containing "embed") nor part of an already-quantized
// layer, and that can_quantize(qtype, O, K) allows; every other tensor, the "__metadata__" and the
// order of the file are kept, and each tensor is copied byte for byte. One tensor is in memory at
// a time (peak: the largest quantized tensor in fp32, twice, plus its packed form). `out` is
// written through a temporary file and a rename; it may not be `in` itself.
//
// `in` is anything checkpoint_files() resolves: a file, an index or a directory. A sharded input
// goes either into one file (`out` ends in ".safetensors": the shards' tensors in shard order, the
// shards' "__metadata__" merged, the first shard's value kept on a clash) or, when `out` ends in
// ".index.json", into as many shards of the same file names in `out`'s directory plus that index
// (its weight map the written tensors, its metadata the input index's with "total_size" the
// written data bytes); a layer's packed parts and marker go into its weight's shard. The shards
// are written to temporary files and renamed only once all are complete, the index last; an
// output shard may not be an input file. A sharded output needs a sharded input.
QuantizeReport quantize_checkpoint(const std::string& in, const std::string& out, QType qtype,
                                   const QuantizeOptions& options, Context& ctx);

// ---- back to full precision (`lowbit dequantize`) --------------------------------------------

struct DequantizeOptions {
  // Each layer in the dtype its lowbit marker records as its source (F32, BF16 or F16; ComfyUI
  // layers record none and get `dtype`); false: every layer in `dtype`.
  bool source_dtype = true;
  FileDType dtype = FileDType::bf16;  // F32, BF16 or F16
  ProgressFn progress;
  const std::atomic<bool>* cancel = nullptr;
  WriterOptions writer;
};

struct RestoredLayer {
  std::string name;            // {prefix}weight
  std::vector<int64_t> shape;  // (O, K)
  std::string qtype;           // what it was
  FileDType dtype = FileDType::bf16;
  uint64_t bytes_before = 0;  // its parts and marker
  uint64_t bytes_after = 0;   // the restored weight
};

struct DequantizeReport : CheckpointIO {
  std::vector<RestoredLayer> layers;  // in file order
};

// The inverse of quantize_checkpoint for inspection and for other tools: every quantized layer
// (lowbit or ComfyUI marker) becomes `{prefix}weight` = dequantize_weight(layer) in the original
// basis (the rotation undone), converted to the layer's dtype with round-to-nearest-even, in the
// place of its codes; its other parts and its marker are dropped, every other tensor is copied
// byte for byte and the "lowbit.*" metadata removed. Inputs and outputs as quantize_checkpoint
// (a file, an index or a directory; one file or shards with an index), with the same guarantees
// (nothing written on an error or a cancel, never over an input file); each layer's parts are
// validated by load_quantized_layer as it is restored.
DequantizeReport dequantize_checkpoint(const std::string& in, const std::string& out,
                                       const DequantizeOptions& options, Context& ctx);

}  // namespace lowbit
