// polychip's PyTorch backend: the `polychip` device (PyTorch's PrivateUse1
// key) over libpolychip, the C API the `polychip` package is built on.
//
// What PyTorch needs of a device lives here: an allocator over the host's
// device memory (every storage is a byte tensor of one plugin's device; the
// DataPtr's context is its `polychip_tensor_t *`), a device guard with
// streams and events, hooks (generators, pointers), the view and resize
// operators, copies between CPU and every vendor's device, scalar reads,
// fills, and the CPU fallback that every other aten operator takes, counted
// per operator and refused in strict mode. The operators that run on the
// plugins are registered from Python (polychip/torch/_aten.py), which asks
// this module for typed views of tensors (`handle`).
//
// Device memory is never touched directly: a plugin's memory need not be
// host-visible (Cobalt stores its bytes encoded), so every transfer goes
// through libpolychip. The C API's operators run on the default stream and
// return when done, so work is complete when a call returns: streams are
// ordering labels, events are timestamps.
//
// This file links against the `polychip._native` module that is already
// loaded in the process, so PyTorch and the `polychip` package share one
// host, one set of plugins and one handle registry.

#include <torch/extension.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/NestedTensorImpl.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Generator.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <pthread.h>
#include <map>
#include <set>
#include <mutex>
#include <string>
#include <vector>

#include "libpolychip.h"

namespace polychip_torch {
namespace {

// ----------------------------------------------------------------- state

const polychip_runtime_t* g_runtime = nullptr;
c10::DeviceIndex g_device_count = 0;
thread_local c10::DeviceIndex t_device = 0;
thread_local c10::StreamId t_stream[64] = {};
std::atomic<bool> g_strict{false};
// Set in a child of fork(): the plugins' devices, threads and memory are the
// parent's (see Allocator::allocate).
std::atomic<bool> g_forked{false};

std::mutex g_fallback_mutex;
// Per aten operator: CPU fallback calls, and seconds spent in them.
std::map<std::string, std::pair<int64_t, double>> g_fallbacks;

// One allocation: the byte tensor that owns the memory (the DataPtr's
// context points to this).
struct Block {
  polychip_tensor_t* handle;
  uintptr_t address;
  size_t bytes;
  c10::DeviceIndex device;
};
std::mutex g_alloc_mutex;
// Live allocations of at least one byte, by address: pointers to a device,
// copy_data.
std::map<uintptr_t, Block*> g_blocks;
int64_t g_live = 0;
std::vector<int64_t> g_allocated, g_peak;

void require_init() {
  TORCH_CHECK(
      g_runtime != nullptr,
      "the polychip device is not initialized: import polychip.torch first");
}

// Throws the message of a libpolychip error (and frees it).
void check(polychip_error_t* error, const char* what) {
  if (error == nullptr) return;
  std::string message = polychip_error_message(error);
  polychip_error_destroy(error);
  TORCH_CHECK(false, "polychip: ", what, ": ", message);
}

// Nanoseconds spent inside libpolychip's operator and transfer calls made
// from here (the benchmark's "plugin" share; Python kernels time theirs).
std::atomic<int64_t> g_plugin_ns{0};

// Runs one libpolychip call, timing it, and throws its error.
template <class F>
void timed(const char* what, F&& call) {
  const auto start = std::chrono::steady_clock::now();
  polychip_error_t* e = call();
  g_plugin_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - start)
                     .count();
  check(e, what);
}

void check_device(c10::DeviceIndex index) {
  require_init();
  TORCH_CHECK(
      index >= 0 && index < g_device_count,
      "polychip:", static_cast<int>(index), " does not exist: this process has ",
      static_cast<int>(g_device_count),
      " polychip devices (polychip.torch.device_info(i) lists them)");
}

// Refuses any use of the device in a child of fork().
void check_not_forked() {
  TORCH_CHECK(!g_forked.load(),
              "polychip: this process was forked from the one that loaded the polychip "
              "device (a DataLoader worker, a multiprocessing 'fork' child), and a device "
              "cannot be used across fork, as CUDA's cannot: make CPU tensors there and move "
              "them to the device in the parent (DataLoader(pin_memory=True) speeds the copy), "
              "or start children with the 'spawn' method");
}

// ------------------------------------------------------------- allocator

void free_allocation(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  {
    std::lock_guard<std::mutex> lock(g_alloc_mutex);
    if (block->bytes > 0) g_blocks.erase(block->address);
    g_allocated[block->device] -= static_cast<int64_t>(block->bytes);
    g_live -= 1;
  }
  polychip_tensor_destroy(block->handle);
  delete block;
}

bool find_block(const void* p, Block* out);

// A storage PyTorch made over device memory that libpolychip holds but this
// allocator did not give out (torch.from_dlpack of a polychip tensor whose
// device memory is not host-visible, which DLPack names kDLExtDev): the
// storage's own DataPtr (whose deleter runs the producer's DLPack deleter)
// and libpolychip's import of the same bytes, which the storage owns from
// its first use on.
struct Imported {
  at::DataPtr original;
  polychip_tensor_t* handle;
};

void free_imported(void* ctx) {
  auto* imported = static_cast<Imported*>(ctx);
  polychip_tensor_destroy(imported->handle);
  delete imported;  // `original` last: the producer's memory outlives the import
}

// The DLPack tensor lent to libpolychip's import: the storage's bytes,
// which the storage keeps (its deleter only frees this description).
struct Lent {
  polychip_dlpack_versioned_t managed;
  int64_t shape[1];
};

void free_lent(polychip_dlpack_versioned_t* managed) {
  delete reinterpret_cast<Lent*>(managed);
}

std::mutex g_import_mutex;

// The byte tensor behind a storage, and where in it the storage starts. A
// storage PyTorch made over device memory without the allocator (legacy
// pickling's `_write_file`, as `pickle.dumps` of a tensor runs it, wraps a
// storage's pointer in one of its own) is found by its address among the
// live allocations; one over memory libpolychip gave another owner
// (torch.from_dlpack of a polychip tensor) is imported through DLPack, which
// refuses memory libpolychip does not hold, and keeps the import.
std::pair<polychip_tensor_t*, uint64_t> storage_handle(const c10::Storage& storage) {
  const auto& ptr = storage.data_ptr();
  if (ptr.get_deleter() == &free_allocation) {
    return {static_cast<Block*>(ptr.get_context())->handle, 0};
  }
  if (ptr.get_deleter() == &free_imported) {
    return {static_cast<Imported*>(ptr.get_context())->handle, 0};
  }
  Block block{};
  TORCH_CHECK(ptr.get() != nullptr,
              "polychip: a polychip tensor's storage addresses no memory, so it cannot be "
              "handed to a plugin");
  if (find_block(ptr.get(), &block)) {
    return {block.handle, reinterpret_cast<uintptr_t>(ptr.get()) - block.address};
  }
  std::lock_guard<std::mutex> lock(g_import_mutex);
  auto* impl = storage.unsafeGetStorageImpl();
  if (impl->data_ptr().get_deleter() == &free_imported) {  // imported meanwhile
    return {static_cast<Imported*>(impl->data_ptr().get_context())->handle, 0};
  }
  void* data = impl->data_ptr().get();
  const auto device = storage.device();
  auto* lent = new Lent{};
  lent->shape[0] = static_cast<int64_t>(storage.nbytes());
  lent->managed.version = {1, 0};
  lent->managed.deleter = &free_lent;
  lent->managed.dl_tensor.data = data;
  lent->managed.dl_tensor.device = {12, static_cast<int32_t>(device.index())};
  lent->managed.dl_tensor.ndim = 1;
  lent->managed.dl_tensor.dtype = {1, 8, 1};  // bytes
  lent->managed.dl_tensor.shape = lent->shape;
  polychip_tensor_t* handle = nullptr;
  polychip_error_t* error =
      polychip_tensor_from_dlpack(g_runtime, &lent->managed, device.index(), &handle);
  if (error != nullptr) {
    delete lent;  // still ours on failure
    std::string message = polychip_error_message(error);
    polychip_error_destroy(error);
    TORCH_CHECK(false, "polychip: a polychip tensor's storage (", storage.nbytes(),
                " bytes at ", data, " on ", device,
                ") was not allocated by polychip.torch, and libpolychip refused it: ", message);
  }
  auto* imported = new Imported{at::DataPtr(), handle};
  imported->original = impl->set_data_ptr(at::DataPtr(data, imported, &free_imported, device));
  return {handle, 0};
}

// A device allocator, as torch.accelerator's memory functions ask of every
// accelerator: no cache to empty, no streams to track (work is complete when
// a call returns), the bytes live and at their peak per device.
struct Allocator final : c10::DeviceAllocator {
  bool initialized() override { return g_runtime != nullptr; }
  void emptyCache(c10::MempoolId_t /*pool*/) override {}
  void recordStream(const at::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_device(device);
    c10::CachingDeviceAllocator::DeviceStats stats;
    std::lock_guard<std::mutex> lock(g_alloc_mutex);
    for (auto* bytes : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
                        &stats.requested_bytes}) {
      auto& all = (*bytes)[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      all.current = g_allocated[device];
      all.peak = g_peak[device];
    }
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override { check_device(device); }
  void resetPeakStats(c10::DeviceIndex device) override {
    check_device(device);
    std::lock_guard<std::mutex> lock(g_alloc_mutex);
    g_peak[device] = g_allocated[device];
  }

  at::DataPtr allocate(size_t nbytes) override {
    const auto device = t_device;
    check_device(device);
    check_not_forked();
    const int64_t shape[1] = {static_cast<int64_t>(nbytes)};
    polychip_tensor_t* handle = nullptr;
    check(
        polychip_tensor_new(
            g_runtime, device, POLYCHIP_DTYPE_U8, 1, shape, false, &handle),
        "allocating device memory");
    polychip_tensor_info_t info{};
    info.struct_size = sizeof info;
    polychip_error_t* e = polychip_tensor_info(handle, &info);
    if (e != nullptr) {
      polychip_tensor_destroy(handle);
      check(e, "describing new device memory");
    }
    auto* data = static_cast<char*>(info.data) + info.byte_offset;
    auto* block = new Block{handle, reinterpret_cast<uintptr_t>(data), nbytes, device};
    {
      std::lock_guard<std::mutex> lock(g_alloc_mutex);
      if (nbytes > 0) g_blocks[block->address] = block;
      g_allocated[device] += static_cast<int64_t>(nbytes);
      g_peak[device] = std::max(g_peak[device], g_allocated[device]);
      g_live += 1;
    }
    return {data, block, &free_allocation,
            c10::Device(c10::DeviceType::PrivateUse1, device)};
  }

  at::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override;
};

Allocator g_allocator;

// Page-locked host memory is a CUDA notion; the plugins copy from any host
// memory alike. But PyTorch asks a device for pinned buffers (DataLoader's
// pin_memory, DistributedDataParallel's reducer, which asserts it got
// them), so "pinned" memory is host memory this allocator made and
// remembers: is_pinned() says true of it and of nothing else.
std::mutex g_pinned_mutex;
std::map<uintptr_t, size_t> g_pinned;  // start -> bytes

void free_pinned(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  std::free(ptr);
}

bool is_pinned(const void* data) {
  const auto p = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  auto it = g_pinned.upper_bound(p);
  if (it == g_pinned.begin()) return false;
  --it;
  return p < it->first + std::max<size_t>(it->second, 1);
}

struct PinnedAllocator final : at::Allocator {
  at::DataPtr allocate(size_t nbytes) override {
    void* ptr = std::malloc(std::max<size_t>(nbytes, 1));
    TORCH_CHECK(ptr != nullptr, "polychip: could not allocate ", nbytes,
                " bytes of pinned host memory");
    {
      std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
    }
    return {ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);
  }
};

PinnedAllocator g_pinned_allocator;

// The allocation holding address `p`, if any (copied out under the lock).
bool find_block(const void* p, Block* out) {
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = g_blocks.upper_bound(addr);
  if (it == g_blocks.begin()) return false;
  --it;
  if (addr < it->first || addr >= it->first + it->second->bytes) return false;
  *out = *it->second;
  return true;
}

// ------------------------------------------------------------------ views

polychip_dtype_t dtype_code(at::ScalarType t, bool* ok) {
  *ok = true;
  switch (t) {
    case at::kFloat: return POLYCHIP_DTYPE_F32;
    case at::kHalf: return POLYCHIP_DTYPE_F16;
    case at::kBFloat16: return POLYCHIP_DTYPE_BF16;
    case at::kDouble: return POLYCHIP_DTYPE_F64;
    case at::kInt: return POLYCHIP_DTYPE_I32;
    case at::kLong: return POLYCHIP_DTYPE_I64;
    case at::kByte: return POLYCHIP_DTYPE_U8;
    case at::kBool: return POLYCHIP_DTYPE_BOOL;
    default: *ok = false; return 0;
  }
}

bool is_polychip(const at::Tensor& t) {
  return t.device().type() == c10::DeviceType::PrivateUse1;
}

bool is_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

// An owned handle for a typed view of a polychip tensor: its dtype, sizes,
// strides and offset over the storage's byte tensor.
polychip_tensor_t* view_of(const at::Tensor& t) {
  TORCH_CHECK(is_polychip(t), "polychip: expected a polychip tensor, got one on ", t.device());
  check_not_forked();
  bool ok = false;
  const auto code = dtype_code(t.scalar_type(), &ok);
  TORCH_CHECK(ok, "polychip: torch.", c10::getDtypeNames(t.scalar_type()).first,
              " tensors are not supported on the device (it holds float32, float16, bfloat16, "
              "float64, int32, int64, uint8 and bool)");
  polychip_tensor_t* out = nullptr;
  // A view of no elements addresses no memory: its offset (a chunk of an
  // empty tensor may start past its storage's end) is taken as 0.
  const auto [handle, start] = storage_handle(t.storage());
  const uint64_t offset =
      t.numel() == 0 ? 0
                     : start + static_cast<uint64_t>(t.storage_offset()) * t.element_size();
  check(
      polychip_tensor_view_as(handle, code, static_cast<int32_t>(t.dim()), t.sizes().data(),
                              t.strides().data(), offset, &out),
      "viewing a tensor");
  return out;
}

// A handle for `t`'s memory as the copies move it: a typed view where the
// device holds its dtype, else a view of its bytes (uint8, one more
// dimension of the element's size), so that a tensor of any dtype (int8,
// int16, complex, float8, ...) can be stored, copied and moved, while the
// operators take only the dtypes above (the others run on the CPU).
polychip_tensor_t* storage_view_of(const at::Tensor& t) {
  bool ok = false;
  dtype_code(t.scalar_type(), &ok);
  if (ok) return view_of(t);
  TORCH_CHECK(is_polychip(t), "polychip: expected a polychip tensor, got one on ", t.device());
  check_not_forked();
  const int64_t size = static_cast<int64_t>(t.element_size());
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  std::vector<int64_t> strides;
  for (const int64_t s : t.strides()) strides.push_back(s * size);
  sizes.push_back(size);
  strides.push_back(1);
  const auto [handle, start] = storage_handle(t.storage());
  const uint64_t offset =
      t.numel() == 0 ? 0 : start + static_cast<uint64_t>(t.storage_offset()) * size;
  polychip_tensor_t* out = nullptr;
  check(polychip_tensor_view_as(handle, POLYCHIP_DTYPE_U8, static_cast<int32_t>(sizes.size()),
                                sizes.data(), strides.data(), offset, &out),
        "viewing a tensor's bytes");
  return out;
}

// A view handle freed at scope exit: typed (`View`), or for the copies of
// any dtype (`View(t, View::kBytes)`) as `storage_view_of` makes it.
struct View {
  polychip_tensor_t* h;
  enum Bytes { kBytes };
  explicit View(const at::Tensor& t) : h(view_of(t)) {}
  View(const at::Tensor& t, Bytes) : h(storage_view_of(t)) {}
  ~View() { polychip_tensor_destroy(h); }
  View(const View&) = delete;
  View& operator=(const View&) = delete;
};

// ------------------------------------------------------------- fallbacks

void count_fallback(const std::string& name) {
  if (g_strict.load()) {
    TORCH_CHECK(
        false, "polychip strict mode: ", name,
        " has no polychip kernel for these arguments and would run on the CPU "
        "(polychip.torch.strict(False) allows CPU fallbacks; "
        "polychip.torch.fallback_report() lists them)");
  }
  std::lock_guard<std::mutex> lock(g_fallback_mutex);
  g_fallbacks[name].first += 1;
}

void add_fallback_time(const std::string& name, double seconds) {
  std::lock_guard<std::mutex> lock(g_fallback_mutex);
  g_fallbacks[name].second += seconds;
}

// Times a fallback's work into its operator's entry.
struct FallbackTimer {
  std::string name;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  explicit FallbackTimer(std::string n) : name(std::move(n)) {}
  ~FallbackTimer() {
    add_fallback_time(
        name, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
};

std::string op_label(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

// PyTorch's rule for an operator's tensors: one device (0-d CPU tensors
// aside, and, for advanced indexing, index tensors on the CPU, as PyTorch
// allows `x[cpu_index]` on any device). The CPU fallback would otherwise
// compute across devices.
void check_one_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto n = op.schema().arguments().size();
  // Only an operator with an optional-tensor list (the index operators'
  // indices) asks, so other fallbacks compare no names.
  auto cpu_indices = [&op] {
    const auto& base = op.schema().operator_name().name;
    return base == "aten::index" || base == "aten::index_put" || base == "aten::index_put_" ||
           base == "aten::_index_put_impl_" || base == "aten::_unsafe_index" ||
           base == "aten::_unsafe_index_put";
  };
  std::optional<c10::Device> first;
  auto visit = [&](const at::Tensor& t) {
    if (!t.defined() || (t.device().is_cpu() && t.dim() == 0)) return;
    if (!first) {
      first = t.device();
    } else {
      TORCH_CHECK(*first == t.device(),
                  "Expected all tensors to be on the same device, but found at least two devices, ",
                  *first, " and ", t.device(), "! (", op_label(op.schema().operator_name()), ")");
    }
  };
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    const auto& v = stack[i];
    if (v.isTensor()) {
      visit(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) visit(t);
    } else if (v.isOptionalTensorList()) {
      const bool skip_cpu = cpu_indices();
      for (const std::optional<at::Tensor> t : v.toOptionalTensorList()) {
        if (t.has_value() && !(skip_cpu && t->defined() && t->device().is_cpu())) visit(*t);
      }
    }
  }
}

std::vector<at::Generator>& generators();

// The device a fallback's random draws belong to: its generator's, else
// that of its first polychip tensor or device argument.
std::optional<c10::DeviceIndex> random_device(const torch::jit::Stack& stack, size_t base) {
  for (size_t i = base; i < stack.size(); ++i) {
    const auto& v = stack[i];
    if (v.isTensor() && v.toTensor().defined() &&
        v.toTensor().device().type() == c10::DeviceType::PrivateUse1) {
      return v.toTensor().device().index();
    }
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      return v.toDevice().has_index() ? v.toDevice().index() : t_device;
    }
  }
  return std::nullopt;
}

// Random operators draw from a polychip generator as CUDA's draw from
// theirs: the one given, or else the device's default (so that
// torch.polychip.manual_seed and get/set_rng_state govern them). The CPU
// kernel takes CPU generators only, so the polychip one lends its state to
// a CPU generator for the call and takes the advanced state back after.
// A random operator without a generator argument draws from the CPU's
// default generator: that one holds the device's state for the call and
// gets its own back after (CPU draws in other threads meanwhile would see
// the device's stream; dropout, the common one, is composed in _aten.py
// of bernoulli_, which takes a generator, so it does not come here).
struct LentGenerators {
  std::recursive_mutex& mutex() {
    static std::recursive_mutex m;
    return m;
  }
  std::unique_lock<std::recursive_mutex> lock{mutex(), std::defer_lock};
  std::vector<std::pair<at::Generator, at::Generator>> lent;  // (polychip, CPU)
  at::Tensor cpu_default_state;  // defined while the CPU default is lent

  void lend(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const auto& args = op.schema().arguments();
    const auto base = stack->size() - args.size();
    bool takes_generator = false;
    for (size_t i = 0; i < args.size(); ++i) {
      const auto& type = args[i].type();
      const bool generator =
          type->kind() == c10::TypeKind::GeneratorType ||
          (type->kind() == c10::TypeKind::OptionalType &&
           type->castRaw<c10::OptionalType>()->getElementType()->kind() ==
               c10::TypeKind::GeneratorType);
      if (!generator) continue;
      takes_generator = true;
      auto& v = (*stack)[base + i];
      at::Generator own;
      if (v.isGenerator()) {
        own = v.toGenerator();
        if (own.device().type() != c10::DeviceType::PrivateUse1) {
          TORCH_CHECK(!random_device(*stack, base),
                      "Expected a 'polychip' device type for generator but found '",
                      own.device().type(), "'");
          continue;
        }
      } else {
        const auto device = random_device(*stack, base);
        if (!device || *device < 0 || static_cast<size_t>(*device) >= generators().size()) continue;
        own = generators()[*device];
      }
      if (!lock.owns_lock()) lock.lock();
      auto cpu = at::make_generator<at::CPUGeneratorImpl>();
      {
        std::lock_guard<std::mutex> g(own.mutex());
        cpu.set_state(own.get_state());
      }
      v = c10::IValue(cpu);
      lent.emplace_back(own, cpu);
    }
    if (takes_generator || !op.hasTag(at::Tag::nondeterministic_seeded)) return;
    const auto device = random_device(*stack, base);
    if (!device || *device < 0 || static_cast<size_t>(*device) >= generators().size()) return;
    lock.lock();
    at::Generator own = generators()[*device];
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> g(own.mutex());
    std::lock_guard<std::mutex> c(cpu.mutex());
    cpu_default_state = cpu.get_state();
    cpu.set_state(own.get_state());
    lent.emplace_back(own, cpu);
  }

  ~LentGenerators() {
    for (auto& [own, cpu] : lent) {
      std::lock_guard<std::mutex> g(own.mutex());
      std::lock_guard<std::mutex> c(cpu.mutex());
      own.set_state(cpu.get_state());
    }
    if (cpu_default_state.defined()) {
      at::Generator cpu = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> c(cpu.mutex());
      cpu.set_state(cpu_default_state);
    }
  }
};

// A CPU fallback builds its whole result in host memory before it moves
// to the device, so its result could be larger than the device holds: an
// operator sized by numbers (a factory: `torch.eye(n, device=d)`,
// `tril_indices`; a pad of a few elements by 2^30 on each side, which the
// CPU's `replication_pad1d` builds) is first run on the meta device
// (shapes, no data; device tensors as meta tensors of their sizes), and a
// new result of more than 16 MiB is allocated on the device once, so that
// a device that cannot hold it refuses it as out of its memory before the
// host builds it (`torch.eye(2**15, device=d)` on a 256 MiB device took 4
// GB of host memory for 3.5 s, `tril_indices(2**15, 2**15)` 8 GB for 20 s,
// until 2026-12-06; a replicate or reflect pad took as much, until hostile
// sweep 6). An operator the meta device cannot run (one sized by its
// inputs' values) is not checked.
void reserve_fallback_result(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto n = op.schema().arguments().size();
  std::optional<c10::Device> device;
  torch::jit::Stack meta;
  // The meta device's first run loads PyTorch's meta registrations (some
  // 2.5 s): it is run only where the numbers could size a large result,
  // their magnitudes' product past 2^21 (`eye(3)` is not checked).
  double product = 1.0;
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    const auto& v = stack[i];
    if (v.isInt()) {
      product *= std::max<double>(1.0, std::abs(static_cast<double>(v.toInt())));
    } else if (v.isIntList()) {
      for (const int64_t x : v.toIntList()) product *= std::max<double>(1.0, std::abs(static_cast<double>(x)));
    }
  }
  if (product <= double(1 << 21)) return;
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    const auto& v = stack[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        meta.push_back(v);
        continue;
      }
      if (!is_polychip(t)) return;  // a CPU tensor's data may size it
      device = t.device();
      meta.push_back(at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta)));
    } else if (v.isTensorList() || v.isOptionalTensorList()) {
      // (Not every list: an int list is a list too, and `isList` took the
      // pads' sizes for one, so a pad was never checked.)
      return;
    } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      device = v.toDevice();
      meta.push_back(c10::Device(at::kMeta));
    } else {
      meta.push_back(v);
    }
  }
  if (!device) return;
  // Each input's storage and its bytes before the call.
  std::vector<std::pair<c10::Storage, size_t>> inputs;
  for (const auto& v : meta) {
    if (v.isTensor() && v.toTensor().defined()) {
      const auto& storage = v.toTensor().storage();
      inputs.emplace_back(storage, storage.nbytes());
    }
  }
  try {
    op.callBoxed(&meta);
  } catch (const std::exception&) {
    return;
  }
  int64_t bytes = 0;
  for (const auto& v : meta) {
    if (!v.isTensor() || !v.toTensor().defined()) continue;
    const at::Tensor& t = v.toTensor();
    // A result written into an input (in place, out=) takes only what it
    // grew by (`eye.out` resizes an empty `out`).
    int64_t held = 0;
    bool aliased = false;
    for (const auto& [storage, before] : inputs) {
      if (!t.storage().is_alias_of(storage)) continue;
      aliased = true;
      held = std::max<int64_t>(held, static_cast<int64_t>(storage.nbytes()) - static_cast<int64_t>(before));
    }
    bytes += aliased ? held : static_cast<int64_t>(t.nbytes());
  }
  if (bytes <= (int64_t{16} << 20)) return;
  // Taken and given back at once: the fallback's own result is made later.
  at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(*device));
}

// The CPU fallback copies each device tensor to the host by itself, so an
// input lying partly over the tensor an operator writes
// (`a[1:].atan2_(a[:-1])`, `torch.sigmoid(a[:-1], out=a[1:])`) was
// computed as if cloned, where PyTorch's CPU refuses it: refused here as
// there, before anything runs (hostile sweep 6). For an `out=` operator
// only an input that broadcasts to the output, as a pointwise operator's
// does: the CPU takes a reduction's `out=` over its input
// (`torch.sum(a, 0, out=a[0])`).
void check_written_overlap(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& name = op.schema().name();
  const bool in_place = !name.empty() && name.back() == '_';
  const auto& args = op.schema().arguments();
  const auto base = stack.size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& w = stack[base + i];
    const bool writes = args[i].alias_info() != nullptr && args[i].alias_info()->isWrite();
    if (!writes || !w.isTensor() || !w.toTensor().defined() || !is_polychip(w.toTensor())) continue;
    for (size_t j = 0; j < args.size(); ++j) {
      const auto& r = stack[base + j];
      if (j == i || !r.isTensor() || !r.toTensor().defined() || !is_polychip(r.toTensor())) continue;
      if (!in_place && !at::is_expandable_to(r.toTensor().sizes(), w.toTensor().sizes())) continue;
      at::assert_no_partial_overlap(w.toTensor(), r.toTensor());
    }
  }
}

// The operators whose result is sized by their input's values, which the
// meta device cannot size: `repeat_interleave(repeats)` (the sum of
// `repeats`) and `bincount(x)` (the largest value plus one). Their result
// is taken on the device once first, as above: `torch.repeat_interleave(x,
// torch.tensor([2**30, 1], device=d), dim=1)` held 7.5 GB of the host for
// 27 s before a 256 MiB device refused it, until hostile sweep 6.
void reserve_value_sized_result(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto name = op_label(op.schema().operator_name());
  const bool repeats = name == "aten::repeat_interleave.Tensor";
  if (!repeats && name != "aten::bincount") return;
  const auto n = op.schema().arguments().size();
  const auto base = stack.size() - n;
  const auto& first = stack[base];
  if (!first.isTensor() || !first.toTensor().defined() || !is_polychip(first.toTensor())) return;
  const at::Tensor& values = first.toTensor();
  if (values.numel() == 0 || values.dim() != 1 || !at::isIntegralType(values.scalar_type(), false)) return;
  const at::Tensor host = values.to(at::kCPU).to(at::kDouble);
  if (host.min().item<double>() < 0) return;  // the CPU's refusal
  double count = 0;
  int64_t element = 8;
  if (repeats) {
    const auto& given = stack[base + 1];
    count = given.isInt() ? static_cast<double>(given.toInt()) : host.sum().item<double>();
  } else {
    count = host.max().item<double>() + 1;
    if (stack[base + 2].isInt()) count = std::max(count, static_cast<double>(stack[base + 2].toInt()));
    const auto& weights = stack[base + 1];
    if (weights.isTensor() && weights.toTensor().defined() && weights.toTensor().scalar_type() == at::kFloat) {
      element = 4;
    }
  }
  const double bytes = count * static_cast<double>(element);
  if (bytes <= double(int64_t{16} << 20)) return;
  // More than any device holds is refused by the device as it is.
  const double most = double(int64_t{1} << 62);
  at::empty({static_cast<int64_t>(std::min(bytes, most))},
            at::TensorOptions().dtype(at::kByte).device(values.device()));
}

void boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_one_device(op, *stack);
  check_written_overlap(op, *stack);
  reserve_fallback_result(op, *stack);
  reserve_value_sized_result(op, *stack);
  const auto name = op_label(op.schema().operator_name());
  count_fallback(name);
  FallbackTimer timer(name);
  LentGenerators generators;
  generators.lend(op, stack);
  at::native::cpu_fallback(op, stack);
}

// ---------------------------------------------------------- nested tensors
//
// PyTorch's (strided) nested tensors, such as nn.TransformerEncoder's fast
// path makes of a padded batch in inference, have kernels for the CPU and
// CUDA only. On polychip a nested tensor is its buffer on the device with
// the nested sizes, strides and offsets (CPU metadata) over it; every
// operator on one runs on the CPU, counted like any fallback, its nested
// tensors moved whole (buffer and metadata) each way.

bool on_polychip(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

// `t`'s whole storage as a 1-D tensor, the same sizes, strides and offsets
// over a copy of it on `device`.
at::Tensor nested_on(const at::Tensor& t, c10::Device device) {
  auto* impl = at::native::get_nested_tensor_impl(t);
  at::Tensor buffer = impl->get_unsafe_storage_as_tensor().to(device);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      buffer, impl->get_nested_sizes(), impl->get_nested_strides(), impl->get_storage_offsets());
}

at::Tensor any_on(const at::Tensor& t, c10::Device device) {
  if (!t.defined()) return t;
  return t.is_nested() ? nested_on(t, device) : t.to(device);
}

void nested_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto name = op_label(op.schema().operator_name());
  // copy_ takes a source on another device, as for dense tensors.
  if (name != "aten::copy_") check_one_device(op, *stack);
  count_fallback(name);
  FallbackTimer timer(name);
  LentGenerators generators;
  generators.lend(op, stack);
  const auto& args = op.schema().arguments();
  const auto n = args.size();
  const auto base = stack->size() - n;
  std::optional<c10::Device> device;
  // (polychip tensor, its CPU copy) of each argument the operator writes.
  std::vector<std::pair<at::Tensor, at::Tensor>> written;
  // (CPU copy, polychip storage) of each nested argument: a result that
  // views the copy's storage (unbind, select, a reshape) is made the same
  // view of the polychip storage, so that writes through it land there.
  std::vector<std::pair<c10::Storage, c10::Storage>> storages;
  auto to_cpu = [&](const at::Tensor& t, bool writes) {
    if (!on_polychip(t)) return t;
    if (!device) device = t.device();
    at::Tensor cpu = any_on(t, at::kCPU);
    if (t.is_nested()) storages.emplace_back(cpu.storage(), t.storage());
    if (writes) written.emplace_back(t, cpu);
    return cpu;
  };
  for (size_t i = 0; i < n; ++i) {
    auto& v = (*stack)[base + i];
    const bool writes = args[i].alias_info() != nullptr && args[i].alias_info()->isWrite();
    if (v.isTensor()) {
      v = to_cpu(v.toTensor(), writes);
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList()) list.push_back(to_cpu(t, writes));
      v = c10::IValue(list);
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> list;
      for (const std::optional<at::Tensor> t : v.toOptionalTensorList()) {
        list.push_back(t.has_value() ? std::optional<at::Tensor>(to_cpu(*t, writes)) : t);
      }
      v = c10::IValue(list);
    }
  }
  op.callBoxed(stack);
  // What the operator wrote goes back into the polychip tensors' storage;
  // a result that is one of them is returned as it.
  for (auto& [dev, cpu] : written) {
    if (dev.is_nested()) {
      auto* d = at::native::get_nested_tensor_impl(dev);
      auto* c = at::native::get_nested_tensor_impl(cpu);
      d->get_unsafe_storage_as_tensor().copy_(c->get_unsafe_storage_as_tensor());
    } else {
      dev.copy_(cpu);
    }
  }
  auto back = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined()) return t;
    for (auto& [dev, cpu] : written) {
      if (t.is_same(cpu)) return dev;
    }
    for (auto& [cpu, dev] : storages) {
      if (!t.storage().is_alias_of(cpu)) continue;
      if (t.is_nested()) {
        auto* impl = at::native::get_nested_tensor_impl(t);
        at::Tensor buffer = at::empty({0}, t.options().device(*device));
        buffer.set_(dev, 0, {static_cast<int64_t>(dev.nbytes() / t.element_size())}, {1});
        return at::detail::make_tensor<at::native::NestedTensorImpl>(
            buffer, impl->get_nested_sizes(), impl->get_nested_strides(),
            impl->get_storage_offsets());
      }
      at::Tensor view = at::empty({0}, t.options().device(*device));
      view.set_(dev, t.storage_offset(), t.sizes(), t.strides());
      return view;
    }
    return device ? any_on(t, *device) : t;
  };
  const auto results = op.schema().returns().size();
  for (size_t i = stack->size() - results; i < stack->size(); ++i) {
    auto& v = (*stack)[i];
    if (v.isTensor()) {
      v = back(v.toTensor());
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList()) list.push_back(back(t));
      v = c10::IValue(list);
    }
  }
}

// A nested tensor's copy to another device or dtype: on the CPU, then to
// the target device (the CPU's own kernel would put a copy meant for the
// CPU back on polychip).
at::Tensor nested_to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                          std::optional<at::Layout> layout, std::optional<at::Device> device,
                          std::optional<bool> pin_memory, bool non_blocking,
                          std::optional<at::MemoryFormat> memory_format) {
  at::Tensor cpu = at::_to_copy(nested_on(self, at::kCPU), dtype, layout, at::Device(at::kCPU),
                                pin_memory, non_blocking, memory_format);
  const auto target = device.value_or(self.device());
  return target.is_cpu() ? cpu : nested_on(cpu, target);
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&nested_fallback>());
}

// Operators that are compositions for dense tensors but have nested
// kernels of their own on the CPU and CUDA: without a kernel here their
// composition would run on the nested tensor (and fail asking its sizes).
TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("_to_copy", nested_to_copy);
  for (const char* name : {"linear", "matmul", "scaled_dot_product_attention", "chunk", "narrow",
                           "split.Tensor", "split_with_sizes", "softmax.int", "dropout"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&nested_fallback>());
  }
}

// Sparse tensors are not supported on the device: said in one sentence
// rather than by the dispatcher's list of every backend.
void sparse_refusal(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, op_label(op.schema().operator_name()),
      ": the polychip device has no sparse tensors (nn.Embedding(sparse=True) and "
      "EmbeddingBag(sparse=True) make sparse gradients: use sparse=False, or keep sparse "
      "tensors on the CPU)");
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_refusal>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_refusal>());
}

// Quantized tensors likewise (the dispatcher's message named
// `aten::empty_quantized` and the `Quantizedpolychip` backend).
void quantized_refusal(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, op_label(op.schema().operator_name()),
      ": the polychip device has no quantized tensors (call .dequantize() first, or keep "
      "quantized tensors on the CPU)");
}

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&quantized_refusal>());
}

// ---------------------------------------------------------------- copies

at::Tensor empty_on(const at::Tensor& like, at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::empty(sizes, like.options().dtype(dtype));
}

// Whether two tensors may share memory (the operators refuse overlapping
// inputs and outputs that are not the same view).
bool may_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (!a.storage().is_alias_of(b.storage())) return false;
  return at::get_overlap_status(a, b) != at::MemOverlapStatus::No;
}

// dst = src where both are polychip tensors on one device, one dtype, one
// shape (src may broadcast through zero strides).
void device_copy(const at::Tensor& src, const at::Tensor& dst) {
  if (may_overlap(src, dst)) {
    at::Tensor tmp = empty_on(dst, dst.sizes(), src.scalar_type());
    device_copy(src, tmp);
    device_copy(tmp, dst);
    return;
  }
  if (src.scalar_type() == dst.scalar_type()) {
    View s(src, View::kBytes), d(dst, View::kBytes);
    timed("copy", [&] { return polychip_op_copy(nullptr, s.h, d.h); });
  } else {
    View s(src), d(dst);
    timed("cast", [&] { return polychip_op_cast(nullptr, s.h, d.h); });
  }
}

// Devices whose plugin lacks `convert` (ABI 1.3): learnt from its first
// "unimplemented" answer, so later conversions go to the CPU at once.
std::mutex g_no_convert_mutex;
std::set<c10::DeviceIndex> g_no_convert;

// dst = (dst's dtype) src through the plugin's `convert`, both on one
// device; false, nothing written, where the plugin lacks it.
bool device_convert(const at::Tensor& src, const at::Tensor& dst) {
  {
    std::lock_guard<std::mutex> lock(g_no_convert_mutex);
    if (g_no_convert.count(dst.device().index())) return false;
  }
  if (may_overlap(src, dst)) {
    at::Tensor tmp = empty_on(dst, dst.sizes(), dst.scalar_type());
    if (!device_convert(src, tmp)) return false;
    device_copy(tmp, dst);
    return true;
  }
  View s(src), d(dst);
  const auto start = std::chrono::steady_clock::now();
  polychip_error_t* e = polychip_op_convert(nullptr, s.h, d.h);
  g_plugin_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - start)
                     .count();
  if (e != nullptr && polychip_error_code(e) == POLYCHIP_API_ERROR_UNIMPLEMENTED) {
    polychip_error_destroy(e);
    std::lock_guard<std::mutex> lock(g_no_convert_mutex);
    g_no_convert.insert(dst.device().index());
    return false;
  }
  check(e, "convert");
  return true;
}

// A copy where either side carries a conjugate or negative bit (a lazy
// `conj()` of a complex tensor, as autograd makes in a complex product's
// backward): through the CPU, which resolves the bits; the device's copies
// move stored values. PyTorch's conjugate fallback would resolve such a
// source by a clone on the device, which copies it again: a recursion
// without end (a segmentation fault).
at::Tensor copy_with_math_bits(const at::Tensor& src, const at::Tensor& dst) {
  const std::string name = "aten::_copy_from (conjugate or negative view)";
  count_fallback(name);
  FallbackTimer timer(name);
  at::Tensor value;
  if (is_polychip(src)) {
    value = at::empty(src.sizes(), src.options().device(at::kCPU));
    View s(src, View::kBytes);
    timed("copy from the device", [&] { return polychip_tensor_read(s.h, value.data_ptr(), value.nbytes()); });
    if (src.is_conj()) value = value.conj_physical();
    if (src.is_neg()) value = value.neg();
  } else {
    value = src.to(at::kCPU).resolve_conj().resolve_neg();
  }
  if (!is_polychip(dst)) {
    const_cast<at::Tensor&>(dst).copy_(value);
    return dst;
  }
  at::Tensor stored = value.to(dst.scalar_type());
  if (dst.is_conj()) stored = stored.conj_physical();
  if (dst.is_neg()) stored = stored.neg();
  stored = stored.contiguous();
  View d(dst, View::kBytes);
  timed("copy to the device", [&] { return polychip_tensor_write(d.h, stored.data_ptr(), stored.nbytes()); });
  return dst;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  TORCH_CHECK(self.defined() && dst.defined(), "polychip: copy of an undefined tensor");
  // The source must broadcast to the destination even when there is
  // nothing to copy (PyTorch's copy_ raises for an empty destination of
  // another shape; the out= way back resizes through copy_from_and_resize).
  at::Tensor src = self.sizes() == dst.sizes() ? self : self.expand(dst.sizes());
  if (dst.numel() == 0) return dst;
  // As PyTorch's CPU refuses them (its copy_ is a TensorIterator): a
  // destination writing one element twice (an expanded view), and a source
  // partly over the destination (`a[1:].copy_(a[:-1])`), which the device
  // copied as if the source were cloned until hostile sweep 6.
  if (is_polychip(dst) && is_polychip(src) && src.device() == dst.device()) {
    at::assert_no_internal_overlap(dst);
    at::assert_no_partial_overlap(dst, src);
  }
  if (src.is_conj() || src.is_neg() || dst.is_conj() || dst.is_neg()) {
    return copy_with_math_bits(src, dst);
  }
  const bool same_dtype = src.scalar_type() == dst.scalar_type();
  // PyTorch's CPU converts f64, int32 and int64 to f16 and bf16 through
  // f32, rounding twice (c10::Half and c10::BFloat16 are made from a
  // float): so does the device, through an f32 copy, where the ABI's
  // `cast` and `convert` round once (`1 + 2^-11 + 2^-40` to f16 was
  // 1.0009765625 on the device and 1.0 on the CPU, 2^30 + 2^22 + 1 to bf16
  // 2^30 + 2^23 and 2^30, until 2026-12-06; a CPU tensor moved to the
  // device as f16 was the CPU's, so `.to(d, f16)` and `.to(d).to(f16)`
  // differed).
  const auto wide = [](at::ScalarType t) { return t == at::kDouble || t == at::kInt || t == at::kLong; };
  const bool half = dst.scalar_type() == at::kHalf || dst.scalar_type() == at::kBFloat16;
  if (is_polychip(src) && is_polychip(dst) && half && wide(src.scalar_type())) {
    at::Tensor mid = empty_on(src, src.sizes(), at::kFloat);
    copy_from(src, mid, false);
    return copy_from(mid, dst, false);
  }
  if (!is_polychip(src)) {
    // CPU (or another host device) to polychip: convert on the CPU, then
    // one write of row-major bytes into the destination view.
    at::Tensor host = src.to(at::kCPU, dst.scalar_type()).contiguous();
    View d(dst, View::kBytes);
    timed("copy to the device", [&] { return polychip_tensor_write(d.h, host.data_ptr(), host.nbytes()); });
    return dst;
  }
  if (!is_polychip(dst)) {
    at::Tensor host = at::empty(src.sizes(), src.options().device(at::kCPU));
    {
      View s(src, View::kBytes);
      timed("copy from the device", [&] { return polychip_tensor_read(s.h, host.data_ptr(), host.nbytes()); });
    }
    const_cast<at::Tensor&>(dst).copy_(host);
    return dst;
  }
  if (src.device() == dst.device() && (same_dtype || (is_float(src.scalar_type()) && is_float(dst.scalar_type())))) {
    device_copy(src, dst);
    return dst;
  }
  if (src.device() != dst.device() && same_dtype) {
    // Between devices, perhaps of two vendors: staged through the host.
    {
      View s(src, View::kBytes), d(dst, View::kBytes);
      timed("copy between devices", [&] { return polychip_tensor_copy(s.h, d.h); });
      return dst;
    }
  }
  if (src.device() != dst.device() && is_float(src.scalar_type()) && is_float(dst.scalar_type())) {
    // Convert where the data is, then move.
    at::Tensor converted = empty_on(src, src.sizes(), dst.scalar_type());
    device_copy(src, converted);
    View s(converted), d(dst);
    timed("copy between devices", [&] { return polychip_tensor_copy(s.h, d.h); });
    return dst;
  }
  // Any other conversion on one device: the plugin's `convert` (ABI 1.3),
  // where its table has it (an older plugin's has not: the call then
  // fails as unimplemented before the plugin runs anything). Not floats to
  // uint8: PyTorch's CPU takes those through int64 and wraps (-1.0 gives
  // 255), where the ABI saturates (C leaves it undefined).
  // Only between the ABI's dtypes (complex, int8, ... are stored and moved,
  // never converted, on the device).
  const bool float_to_byte = is_float(src.scalar_type()) && dst.scalar_type() == at::kByte;
  bool src_abi = false, dst_abi = false;
  dtype_code(src.scalar_type(), &src_abi);
  dtype_code(dst.scalar_type(), &dst_abi);
  if (src.device() == dst.device() && src_abi && dst_abi && !float_to_byte &&
      device_convert(src, dst)) {
    return dst;
  }
  // Conversions the plugins do not have (integers and bools to and from
  // floats on a plugin older than ABI 1.3): through the CPU, counted.
  const std::string name = "aten::_copy_from (" + std::string(c10::toString(src.scalar_type())) +
                           " to " + c10::toString(dst.scalar_type()) + ")";
  count_fallback(name);
  FallbackTimer timer(name);
  at::Tensor host = src.to(at::kCPU).to(dst.scalar_type());
  const_cast<at::Tensor&>(dst).copy_(host);
  return dst;
}

void Allocator::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count == 0) return;
  Block a{}, b{};
  TORCH_CHECK(find_block(src, &a) && find_block(dest, &b),
              "polychip: copy_data between addresses the polychip allocator did not make");
  const int64_t n[1] = {static_cast<int64_t>(count)}, one[1] = {1};
  polychip_tensor_t *s = nullptr, *d = nullptr;
  check(polychip_tensor_view_as(a.handle, POLYCHIP_DTYPE_U8, 1, n, one,
                                reinterpret_cast<uintptr_t>(src) - a.address, &s),
        "copy_data");
  polychip_error_t* e = polychip_tensor_view_as(
      b.handle, POLYCHIP_DTYPE_U8, 1, n, one, reinterpret_cast<uintptr_t>(dest) - b.address, &d);
  if (e == nullptr) e = polychip_tensor_copy(s, d);
  polychip_tensor_destroy(s);
  polychip_tensor_destroy(d);
  check(e, "copy_data");
}

// --------------------------------------------------------- aten: minimum

at::Tensor empty_memory_format(
    c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
    std::optional<c10::Device> device, std::optional<bool> pin_memory,
    std::optional<c10::MemoryFormat> memory_format) {
  const auto dev = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "polychip tensors are strided; layout ", c10::layout_or_default(layout),
              " is not supported");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "pinned memory is a CPU notion");
  const c10::DeviceGuard guard(dev);
  return at::detail::empty_generic(size, &g_allocator,
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(
    c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout, std::optional<c10::Device> device,
    std::optional<bool> pin_memory) {
  const auto dev = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "polychip tensors are strided");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "pinned memory is a CPU notion");
  const c10::DeviceGuard guard(dev);
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(storage_offset));
}

// Resizes a storage to `bytes` (`Storage.resize_`: FSDP frees a sharded
// parameter's storage by resizing it to 0 and grows it back before use),
// keeping the contents the two sizes share, through the device.
void resize_storage(const c10::Storage& storage, size_t bytes) {
  const size_t old = storage.nbytes();
  if (bytes == old) return;
  // As PyTorch's own: a storage over memory it does not own (one made by
  // torch.from_dlpack, shared with its producer) keeps its memory.
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  const c10::DeviceGuard guard(storage.device());
  at::DataPtr fresh = g_allocator.allocate(bytes);
  const size_t kept = std::min(old, bytes);
  if (kept > 0) {
    const int64_t n[1] = {static_cast<int64_t>(kept)}, one[1] = {1};
    polychip_tensor_t *s = nullptr, *d = nullptr;
    const auto [handle, start] = storage_handle(storage);
    check(polychip_tensor_view_as(handle, POLYCHIP_DTYPE_U8, 1, n, one, start, &s), "resize");
    polychip_error_t* e = polychip_tensor_view_as(
        static_cast<Block*>(fresh.get_context())->handle, POLYCHIP_DTYPE_U8, 1, n, one, 0, &d);
    if (e == nullptr) e = polychip_op_copy(nullptr, s, d);
    polychip_tensor_destroy(s);
    polychip_tensor_destroy(d);
    check(e, "resize");
  }
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(fresh));
  storage.unsafeGetStorageImpl()->set_nbytes(bytes);
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!memory_format.has_value() || *memory_format == at::MemoryFormat::Contiguous ||
                  *memory_format == at::MemoryFormat::Preserve,
              "polychip: resize_ supports the contiguous memory format only");
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  // Same sizes: nothing changes, strides included (as PyTorch's own
  // resize_). The CPU fallback writes an in-place or out= result back
  // through copy_from_and_resize, and making a strided view contiguous here
  // wrote the result over the wrong elements of its storage.
  if (self.sizes() == sizes) return self;
  // Refused as PyTorch's own resize_ refuses them: a negative size, and
  // bytes that overflow.
  at::detail::check_size_nonnegative(sizes);
  const size_t needed = at::detail::computeStorageNbytesContiguous(
      sizes, self.element_size(), static_cast<size_t>(self.storage_offset()));
  // Tensor.resize_ only grows its storage (as PyTorch's kernels do), and
  // not for no element; the storage first, so that a refused one leaves the
  // sizes as they were.
  const bool empty = std::find(sizes.begin(), sizes.end(), 0) != sizes.end();
  if (!empty && needed > self.storage().nbytes()) resize_storage(self.storage(), needed);
  self.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return self;
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size,
                         c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                    C10_AS_INTARRAYREF_SLOW(stride));
}

// The CPU fallback's way back for an out= result: an empty `dst` takes the
// result's layout when that is dense (a channels-last or transposed input
// gives a result of its layout, as on the CPU), else it is contiguous.
at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  const bool fresh = dst.numel() == 0;
  resize_(dst, self.sym_sizes(), std::nullopt);
  if (fresh && !self.is_contiguous() && self.is_non_overlapping_and_dense()) {
    const_cast<at::Tensor&>(dst).as_strided_(self.sizes(), self.strides(), dst.storage_offset());
  }
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  at::Tensor host = at::empty({}, self.options().device(at::kCPU));
  View s(self, View::kBytes);
  timed("reading a scalar", [&] { return polychip_tensor_read(s.h, host.data_ptr(), host.nbytes()); });
  return host.item();
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  return at::native::set_(self, source);
}

at::Tensor& set_source_storage_offset(at::Tensor& self, at::Storage storage, int64_t offset,
                                      c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::cpu::set_(self, storage, offset, size, stride);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

// A complex tensor's real view and back: views of the same memory, as on
// the CPU (through the CPU fallback they were copies, so a write into one
// did not reach the other).
at::Tensor view_as_real(const at::Tensor& self) { return at::native::view_as_real(self); }
at::Tensor view_as_complex(const at::Tensor& self) { return at::native::view_as_complex(self); }

bool fill_on_device(const at::Tensor& self, const at::Scalar& value) {
  bool ok = false;
  dtype_code(self.scalar_type(), &ok);
  if (!ok || value.isComplex()) return false;
  // The value as PyTorch converts it into the tensor's dtype: a CPU tensor
  // filled the CPU's way wraps -1 into a uint8's 255 and raises where the
  // CPU raises (300 into uint8, 1e30 or NaN into int32, 1e6 into f16),
  // where the plugin's fill of the double would clamp or saturate. (The
  // CPU fills a one-element tensor by another path, which does not check
  // overflow: so does this, for one.)
  const int64_t n = self.numel() == 1 ? 1 : 2;
  at::Tensor probe = at::empty({n}, at::TensorOptions().dtype(self.scalar_type()));
  probe.fill_(value);
  const at::Scalar converted = probe[0].item();
  if (self.scalar_type() == at::kLong) {
    // f64 carries integers exactly up to 2^53 only.
    const int64_t i = converted.toLong();
    if (i > (int64_t{1} << 53) || i < -(int64_t{1} << 53)) return false;
  }
  const double v = converted.toDouble();
  if (self.numel() == 0) return true;
  // A broadcast view (`t[:, :1].expand(4, 3).fill_(0)`, which the CPU
  // runs) writes each of its zero-stride dimensions' elements to one
  // place: filled as one element there, since the plugin refuses an output
  // that writes an element more than once. Other overlapping views (an
  // `unfold`) are still refused by name.
  at::Tensor target = self;
  for (int64_t d = 0; d < target.dim(); d++) {
    if (target.stride(d) == 0 && target.size(d) > 1) target = target.narrow(d, 0, 1);
  }
  View o(target);
  timed("fill", [&] { return polychip_op_fill(nullptr, o.h, v); });
  return true;
}

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  if (!fill_on_device(self, value)) {
    const std::string name =
        "aten::fill_.Scalar (" + std::string(c10::toString(self.scalar_type())) + ")";
    count_fallback(name);
    FallbackTimer timer(name);
    at::Tensor host = at::empty(self.sizes(), self.options().device(at::kCPU));
    host.fill_(value);
    copy_from(host, self, false);
  }
  return self;
}

at::Tensor& fill_tensor(at::Tensor& self, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "fill_ only supports 0-dimension value tensor but got tensor with ",
              value.dim(), " dimensions.");
  return fill_scalar(self, value.item());
}

at::Tensor& zero(at::Tensor& self) { return fill_scalar(self, 0); }

// Whether `self`'s TensorImpl may take `from`'s contents in place
// (`param.data = other`): true between dense strided CPU and polychip
// tensors, so `Module.to("polychip:N")` keeps each Parameter object, and with
// it the ties between shared parameters (tied embeddings).
bool compatible_shallow_copy(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::Layout::Strided &&
           (t.device().is_cpu() || t.device().type() == c10::DeviceType::PrivateUse1);
  };
  if (dense(self) && dense(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("resize_", resize_);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("view", view);
  m.impl("view_as_real", view_as_real);
  m.impl("view_as_complex", view_as_complex);
  m.impl("fill_.Scalar", fill_scalar);
  m.impl("fill_.Tensor", fill_tensor);
  m.impl("zero_", zero);
  m.impl("_has_compatible_shallow_copy_type", compatible_shallow_copy);
}

// scaled_dot_product_attention asks a device's dispatch stub which kernel
// to use; the answer comes from the `_fused_sdp_choice` kernel registered
// from Python (_aten.py), so the rule lives in one place.
int64_t sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>& mask, double dropout, bool causal,
                   std::optional<double> scale, bool enable_gqa) {
  return at::_fused_sdp_choice(q, k, v, mask, dropout, causal, scale, enable_gqa);
}

// The copies resolve conjugate and negative bits themselves (see
// `copy_with_math_bits`), as the CPU's and CUDA's copy_ do.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&boxed_fallback>());
}

// ------------------------------------------------------ guard and streams

struct Event {
  std::chrono::steady_clock::time_point at;
  bool recorded = false;
};

struct Guard final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kType, t_device); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "polychip guard given a ", d.type(), " device");
    // -1 is "the current device"; below it is an index PyTorch wrapped
    // (it keeps device indices in 8 bits: polychip:128 arrives as -128).
    TORCH_CHECK(d.index() >= -1, "polychip: device index ", static_cast<int>(d.index()),
                " is not a device: this process has ", static_cast<int>(g_device_count),
                " polychip devices (PyTorch keeps a device index in 8 bits, so polychip:128 "
                "and above wrap around)");
    if (d.index() >= 0) {
      check_device(d.index());
      t_device = d.index();
    }
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < g_device_count) t_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    const auto i = d.index() < 0 ? t_device : d.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, i), t_stream[i & 63]);
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    static std::atomic<c10::StreamId> next{1};
    return c10::Stream(c10::Stream::UNSAFE, d, next.fetch_add(1));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high) const override {
    return getNewStream(d, high ? -1 : 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto old = getStream(s.device());
    t_stream[s.device_index() & 63] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return g_device_count; }

  // Work is done when each call returns, so an event is the time it was
  // recorded, every wait is already satisfied and every query is true.
  void record(void** event, const c10::Stream& /*stream*/, const c10::DeviceIndex /*device*/,
              const c10::EventFlag /*flag*/) const override {
    if (*event == nullptr) *event = new Event();
    auto* e = static_cast<Event*>(*event);
    e->at = std::chrono::steady_clock::now();
    e->recorded = true;
  }
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex /*device*/) const noexcept override {
    delete static_cast<Event*>(event);
  }
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  void synchronizeEvent(void* /*event*/) const override {}
  void synchronizeDevice(const c10::DeviceIndex /*device*/) const override {}
  double elapsedTime(void* a, void* b, const c10::DeviceIndex /*device*/) const override {
    auto* x = static_cast<Event*>(a);
    auto* y = static_cast<Event*>(b);
    TORCH_CHECK(x && y && x->recorded && y->recorded,
                "polychip: elapsed_time needs two recorded events");
    return std::chrono::duration<double, std::milli>(y->at - x->at).count();
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, Guard);

// ----------------------------------------------------------------- hooks

struct Generator final : at::CPUGeneratorImpl {
  explicit Generator(c10::DeviceIndex index) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

std::vector<at::Generator>& generators() {
  static std::vector<at::Generator> all;
  return all;
}

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_device_count > 0; }
  bool hasPrimaryContext(c10::DeviceIndex /*device*/) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return g_device_count; }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    check_device(d);
    t_device = d;
  }
  c10::DeviceIndex getCurrentDevice() const override { return t_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = t_device;
    setCurrentDevice(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    if (d < 0 || d >= g_device_count) return t_device;
    return exchangeDevice(d);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    const auto i = d < 0 ? t_device : d;
    check_device(i);
    return generators()[i];
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    const auto i = d < 0 ? t_device : d;
    check_device(i);
    return at::make_generator<Generator>(i);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    Block a{};
    TORCH_CHECK(find_block(data, &a),
                "polychip: the address is not in memory the polychip allocator made");
    return at::Device(at::DeviceType::PrivateUse1, a.device);
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t bytes) const override {
    resize_storage(storage, bytes);
  }
};

// ---------------------------------------------------------------- module

void init(uintptr_t runtime, int64_t device_count) {
  TORCH_CHECK(g_runtime == nullptr || g_runtime == reinterpret_cast<const polychip_runtime_t*>(runtime),
              "the polychip device is already bound to another runtime");
  TORCH_CHECK(device_count >= 0 && device_count <= 64,
              "polychip supports at most 64 devices in one process, not ", device_count);
  if (g_runtime != nullptr) return;
  g_runtime = reinterpret_cast<const polychip_runtime_t*>(runtime);
  g_device_count = static_cast<c10::DeviceIndex>(device_count);
  g_allocated.assign(device_count, 0);
  g_peak.assign(device_count, 0);
  for (int64_t i = 0; i < device_count; ++i) {
    generators().push_back(at::make_generator<Generator>(static_cast<c10::DeviceIndex>(i)));
    generators().back().set_current_seed(c10::detail::getNonDeterministicRandom());
  }
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &g_allocator);
  pthread_atfork(nullptr, nullptr, [] { g_forked.store(true); });
  static Hooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

uintptr_t handle(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(view_of(t)); }

std::vector<uintptr_t> handles(const std::vector<at::Tensor>& ts) {
  std::vector<uintptr_t> out;
  out.reserve(ts.size());
  try {
    for (const auto& t : ts) out.push_back(handle(t));
  } catch (...) {
    for (auto h : out) polychip_tensor_destroy(reinterpret_cast<polychip_tensor_t*>(h));
    throw;
  }
  return out;
}

std::map<std::string, std::pair<int64_t, double>> fallback_counts() {
  std::lock_guard<std::mutex> lock(g_fallback_mutex);
  return g_fallbacks;
}

void reset_fallback_counts() {
  std::lock_guard<std::mutex> lock(g_fallback_mutex);
  g_fallbacks.clear();
}

std::vector<int64_t> memory_stats(int64_t device) {
  check_device(static_cast<c10::DeviceIndex>(device));
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  return {g_allocated[device], g_peak[device], g_live};
}

void reset_peak(int64_t device) {
  check_device(static_cast<c10::DeviceIndex>(device));
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  g_peak[device] = g_allocated[device];
}

}  // namespace
}  // namespace polychip_torch

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &polychip_torch::sdp_choice)
}  // namespace at::native

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace polychip_torch;
  m.def("init", &init, "Binds the polychip device to a libpolychip runtime.");
  m.def("handle", &handle, "An owned polychip_tensor_t* viewing a polychip tensor.");
  m.def("handles", &handles, "handle() of each tensor.");
  m.def("count_fallback", &count_fallback, "Counts one CPU fallback (raises in strict mode).");
  m.def(
      "check_overlap",
      [](const at::Tensor& out, const std::vector<at::Tensor>& inputs, bool exact_too) {
        at::assert_no_internal_overlap(out);
        for (const auto& t : inputs) {
          if (exact_too) {
            at::assert_no_overlap(out, t);
          } else {
            at::assert_no_partial_overlap(out, t);
          }
        }
      },
      "Raises as PyTorch's CPU does where `out` writes an element twice or an input lies "
      "partly over it (with exact_too, also exactly over it: scatter_add_).");
  m.def("add_fallback_time", &add_fallback_time, "Adds seconds to a fallback's time.");
  m.def("fallback_counts", &fallback_counts, "aten operator -> (calls, seconds).");
  m.def("reset_fallback_counts", &reset_fallback_counts);
  m.def("set_strict", [](bool on) { g_strict.store(on); });
  m.def("strict", []() { return g_strict.load(); });
  m.def("current_device", []() { return static_cast<int64_t>(t_device); });
  m.def("set_device", [](int64_t d) {
    check_device(static_cast<c10::DeviceIndex>(d));
    t_device = static_cast<c10::DeviceIndex>(d);
  });
  m.def("device_count", []() { return static_cast<int64_t>(g_device_count); });
  m.def("default_generator", [](int64_t i) {
    check_device(static_cast<c10::DeviceIndex>(i));
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(generators()[i]));
  });
  m.def("plugin_seconds", []() { return static_cast<double>(g_plugin_ns.load()) * 1e-9; },
        "Seconds inside libpolychip calls made by the C++ half.");
  m.def("reset_plugin_seconds", []() { g_plugin_ns = 0; });
  m.def("memory_stats", &memory_stats, "(allocated bytes, peak bytes, live allocations of all devices).");
  m.def("reset_peak", &reset_peak);
}
