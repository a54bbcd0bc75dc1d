// offload::embedding_lookup's CPU kernel for the call it serves without Python (see native.py).
//
// Served here: CPU tensors, indices and offsets int32/int64, 1-D and contiguous, no per-sample
// weights, a float32 result, a resident kernel whose device handed out a C-ABI entry
// (offload/sim/embedding/fused.py: NativeEntry, the fused kernels' own loops behind numba.cfunc),
// and a call the fused kernels run serially. Every other call, and every call the entry declines
// (a rule broken, the device closed, the kernel released), goes through the dispatcher to
// offload::_embedding_lookup_py, the Python implementation, which answers or raises exactly as
// before.
//
// The AutogradCPU kernel does what the Python one (offload/ops/autograd.py) did: a call that needs a
// gradient (weights requiring grad, grad mode on) takes _embedding_lookup_py with its autograd
// node, whose backward raises; a plain CPU call (no dispatch mode, fake or functional tensor) goes
// straight to the CPU kernel; any other redispatches below autograd, where a mode sees this op.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

// int64_t f(const T* table, const int64_t* ctx, const I* idx, int64_t n, const int64_t* off,
//           int64_t noff, float* out, void* scratch): 0 when out is written (fused.py's ABI).
using EntryFn = int64_t (*)(const void*, const int64_t*, const void*, int64_t, const int64_t*, int64_t, float*, void*);

struct Entry {
  EntryFn fn_i64;
  EntryFn fn_i32;
  const void* table;
  const int64_t* ctx;
  int64_t dim;
  int64_t serial_max;
};

using Signature = at::Tensor(int64_t, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, at::ScalarType, bool);

std::shared_mutex g_mutex;
std::unordered_map<int64_t, std::shared_ptr<const Entry>> g_entries;

std::shared_ptr<const Entry> find_entry(int64_t rid) {
  std::shared_lock<std::shared_mutex> lock(g_mutex);
  auto it = g_entries.find(rid);
  return it == g_entries.end() ? nullptr : it->second;
}

// entry: [fn for int64 indices, fn for int32 indices, table address, ctx address, dim, serial_max].
void attach(int64_t rid, c10::IntArrayRef entry) {
  TORCH_CHECK(entry.size() == 6, "_native_embedding_attach: entry must have 6 values, got ", entry.size());
  auto e = std::make_shared<Entry>(Entry{reinterpret_cast<EntryFn>(entry[0]), reinterpret_cast<EntryFn>(entry[1]),
                                         reinterpret_cast<const void*>(entry[2]), reinterpret_cast<const int64_t*>(entry[3]),
                                         entry[4], entry[5]});
  std::unique_lock<std::shared_mutex> lock(g_mutex);
  g_entries[rid] = std::move(e);
}

void detach(int64_t rid) {
  std::shared_ptr<const Entry> gone;
  {
    std::unique_lock<std::shared_mutex> lock(g_mutex);
    auto it = g_entries.find(rid);
    if (it == g_entries.end()) return;
    gone = std::move(it->second);
    g_entries.erase(it);
  }
  // The entry holds raw pointers into arrays Python owns, which may be freed once this returns:
  // wait for the calls already inside it (each holds a reference only while the C ABI runs, which
  // takes no lock and no GIL, so this ends).
  while (gone.use_count() > 1) std::this_thread::yield();
  std::atomic_thread_fence(std::memory_order_acquire);
}

at::Tensor python_path(int64_t rid, const at::Tensor& indices, const at::Tensor& offsets,
                       const std::optional<at::Tensor>& per_sample_weights, at::ScalarType dtype, bool include_last_offset) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("offload::_embedding_lookup_py", "")
                       .typed<Signature>();
  return op.call(rid, indices, offsets, per_sample_weights, dtype, include_last_offset);
}

bool plain_index(const at::Tensor& t) {
  auto s = t.scalar_type();
  return (s == at::kLong || s == at::kInt) && t.dim() == 1 && t.is_contiguous() && t.device().is_cpu();
}

std::optional<at::Tensor> served(const Entry& e, const at::Tensor& indices, const at::Tensor& offsets, bool include_last_offset) {
  const int64_t n = indices.numel();
  const int64_t m = offsets.numel();
  if (m == 0 || (at::get_num_threads() > 1 && n * e.dim >= e.serial_max)) {
    return std::nullopt;  // the Python path: its error, or the fused kernels' threads
  }
  // The kernels take int64 offsets with the end: others are copied (B + 1 values), as fused.run does.
  const int64_t noff = include_last_offset ? m : m + 1;
  std::vector<int64_t> copy;
  const int64_t* off = nullptr;
  if (include_last_offset && offsets.scalar_type() == at::kLong) {
    off = offsets.const_data_ptr<int64_t>();
  } else {
    copy.resize(noff);
    if (offsets.scalar_type() == at::kLong) {
      std::copy_n(offsets.const_data_ptr<int64_t>(), m, copy.begin());
    } else {
      std::copy_n(offsets.const_data_ptr<int32_t>(), m, copy.begin());
    }
    if (!include_last_offset) {
      copy[m] = n;
    }
    off = copy.data();
  }
  const EntryFn fn = indices.scalar_type() == at::kLong ? e.fn_i64 : e.fn_i32;
  at::Tensor out = at::empty({noff - 1, e.dim}, at::TensorOptions().dtype(at::kFloat));
  int64_t stack[256];
  std::vector<int64_t> heap;
  void* scratch = stack;
  if (e.dim > 256) {
    heap.resize(e.dim);
    scratch = heap.data();
  }
  if (fn(e.table, e.ctx, indices.const_data_ptr(), n, off, noff, out.mutable_data_ptr<float>(), scratch) != 0) {
    return std::nullopt;
  }
  return out;
}

at::Tensor lookup(int64_t rid, const at::Tensor& indices, const at::Tensor& offsets,
                  const std::optional<at::Tensor>& per_sample_weights, at::ScalarType dtype, bool include_last_offset) {
  if (dtype == at::kFloat && !per_sample_weights.has_value() && plain_index(indices) && plain_index(offsets)) {
    if (auto e = find_entry(rid)) {
      if (auto out = served(*e, indices, offsets, include_last_offset)) {
        return *out;
      }
    }
  }
  return python_path(rid, indices, offsets, per_sample_weights, dtype, include_last_offset);
}

at::Tensor lookup_autograd(c10::DispatchKeySet ks, int64_t rid, const at::Tensor& indices, const at::Tensor& offsets,
                           const std::optional<at::Tensor>& per_sample_weights, at::ScalarType dtype, bool include_last_offset) {
  if (c10::GradMode::is_enabled() && per_sample_weights.has_value() && per_sample_weights->requires_grad()) {
    return python_path(rid, indices, offsets, per_sample_weights, dtype, include_last_offset);
  }
  const c10::DispatchKeySet below = ks & c10::after_autograd_keyset;
  if (below == c10::DispatchKeySet(c10::DispatchKey::CPU)) {
    return lookup(rid, indices, offsets, per_sample_weights, dtype, include_last_offset);
  }
  static auto self = c10::Dispatcher::singleton().findSchemaOrThrow("offload::embedding_lookup", "").typed<Signature>();
  at::AutoDispatchBelowADInplaceOrView guard;
  return self.redispatch(below, rid, indices, offsets, per_sample_weights, dtype, include_last_offset);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(offload, m) {
  m.def("_native_embedding_attach(int rid, int[] entry) -> ()", &attach);
  m.def("_native_embedding_detach(int rid) -> ()", &detach);
}

TORCH_LIBRARY_IMPL(offload, CPU, m) { m.impl("embedding_lookup", &lookup); }

TORCH_LIBRARY_IMPL(offload, AutogradCPU, m) { m.impl("embedding_lookup", &lookup_autograd); }
