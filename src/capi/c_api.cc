// The C API (include/tessera/c.h) over the C++ client: handles wrap the C++
// objects, Status becomes an errptr string, and no exception leaves.
#include "tessera/c.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "tessera/client.h"
#include "tessera_config.h"

struct tessera_options_t {
  tessera::ClientOptions options;
};
struct tessera_client_t {
  std::unique_ptr<tessera::Client> client;
};
struct tessera_tensor_spec_t {
  tessera::TensorSpec spec;
};
struct tessera_tensor_info_t {
  tessera::TensorInfo info;
};
struct tessera_future_t {
  tessera::Future future;
};

namespace {

using tessera::Status;

char* CopyString(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) std::abort();  // nothing left to report the error with
  std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

// LevelDB's convention: an error replaces (and frees) what errptr held.
bool SaveError(char** errptr, const Status& st) {
  if (st.ok()) return false;
  if (errptr != nullptr) {
    std::free(*errptr);
    *errptr = CopyString(st.ToString());
  }
  return true;
}

// Runs fn, turning an exception (an allocation failure inside) into errptr.
template <typename R, typename Fn>
R Guarded(char** errptr, R on_error, Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::exception& e) {
    SaveError(errptr, Status::Internal(std::string("C++ exception: ") + e.what()));
  } catch (...) {
    SaveError(errptr, Status::Internal("unknown C++ exception"));
  }
  return on_error;
}

template <typename Fn>
void GuardedVoid(char** errptr, Fn&& fn) noexcept {
  Guarded(errptr, 0, [&] {
    fn();
    return 0;
  });
}

// Where no errptr exists to say so, an exception ends the process with its
// cause rather than crossing into C.
template <typename Fn>
auto OrAbort(Fn&& fn) noexcept -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: C API: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "tessera: C API: unknown C++ exception\n");
  }
  std::abort();
}

tessera::Status BadHandle(const char* what) {
  return tessera::Status::InvalidArgument(std::string(what) + " is NULL");
}

tessera::Status SetHyper(tessera::Hyperparams& h, const char* name, double value) {
  if (name == nullptr) return BadHandle("the hyper-parameter name");
  const std::string n = name;
  const auto f = static_cast<float>(value);
  if (n == "learning_rate") {
    h.learning_rate = f;
  } else if (n == "weight_decay") {
    h.weight_decay = f;
  } else if (n == "momentum") {
    h.momentum = f;
  } else if (n == "nesterov") {
    h.nesterov = value != 0.0;
  } else if (n == "beta1") {
    h.beta1 = f;
  } else if (n == "beta2") {
    h.beta2 = f;
  } else if (n == "epsilon") {
    h.epsilon = f;
  } else if (n == "initial_accumulator") {
    h.initial_accumulator = f;
  } else {
    return Status::InvalidArgument(
        "unknown hyper-parameter '" + n +
        "' (expected learning_rate, weight_decay, momentum, nesterov, beta1, beta2, epsilon or "
        "initial_accumulator)");
  }
  return h.Validate().WithContext(n);
}

// A C handle (tessera_tensor_t) is the tensor's index in its low 18 bits
// and its client's generation in the 14 above (c-api.md): another client's
// handle, one kept from a closed client among them, is refused instead of
// naming this client's tensor of that index. Generations run 1..16382, so
// that no handle is 0 or TESSERA_INVALID_TENSOR; a client with the same
// generation is 16382 clients away in the same process.
constexpr int kHandleIndexBits = 18;
constexpr uint32_t kHandleIndexMask = (1u << kHandleIndexBits) - 1;
constexpr uint32_t kGenerations = (1u << (32 - kHandleIndexBits)) - 2;

uint32_t GenerationOf(const tessera::Client& client) { return client.id() % kGenerations + 1; }

tessera::Result<tessera_tensor_t> ToHandle(const tessera::Client& client, tessera::Tensor t) {
  if (t.index > kHandleIndexMask) {
    return Status::ResourceExhausted("a C client holds at most " +
                                     std::to_string(kHandleIndexMask + 1) +
                                     " tensors (a handle has 18 bits of index)");
  }
  return (GenerationOf(client) << kHandleIndexBits) | t.index;
}

// The C++ handle; one of another client's generation carries no client of
// this one's, which Client refuses by name.
tessera::Tensor FromHandle(const tessera::Client& client, tessera_tensor_t handle) {
  const uint32_t index = handle & kHandleIndexMask;
  if (handle >> kHandleIndexBits != GenerationOf(client)) {
    return {index, client.id() == 1 ? 2u : 1u};  // some other client
  }
  return {index, client.id()};
}

// Why a call's arguments cannot even be read (NULL where memory must be).
tessera::Status BadCall(const tessera_client_t* client, const void* items, size_t count) {
  if (client == nullptr) return BadHandle("client");
  if (items == nullptr && count > 0) return BadHandle("items (with a count above 0)");
  return tessera::Status::Ok();
}

// NULL: none of the options. A has_step other than 0 or 1, or a step of
// TESSERA_NO_STEP said to be one, is refused: an options struct left
// uninitialised or half-converted from the calls that took a step.
tessera::Result<tessera::PushOptions> PushOptionsOf(const tessera_push_options_t* options) {
  if (options == nullptr) return tessera::PushOptions{};
  if (options->has_step != 0 && options->has_step != 1) {
    return tessera::Status::InvalidArgument("push options: has_step is " +
                                            std::to_string(options->has_step) +
                                            "; 1 for a push with a step, 0 without");
  }
  if (options->has_step == 1 && options->step == TESSERA_NO_STEP) {
    return tessera::Status::InvalidArgument(
        "push options: has_step is 1 but step is TESSERA_NO_STEP; set has_step to 0 for a "
        "push without a step");
  }
  tessera::PushOptions out;
  if (options->has_step == 1) out.step = options->step;
  out.call.cuda_stream = options->cuda_stream;
  return out;
}

std::vector<tessera::PushItem> PushItems(const tessera::Client& client,
                                         const tessera_push_item_t* items, size_t count) {
  std::vector<tessera::PushItem> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    out.push_back({FromHandle(client, items[i].tensor), items[i].data, items[i].bytes});
  }
  return out;
}

std::vector<tessera::PullItem> PullItems(const tessera::Client& client,
                                         const tessera_pull_item_t* items, size_t count) {
  std::vector<tessera::PullItem> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    tessera::PullItem item{FromHandle(client, items[i].tensor), items[i].data, items[i].bytes};
    item.min_version = items[i].min_version == 0 ? 1 : items[i].min_version;
    item.min_step = items[i].min_step;
    out.push_back(item);
  }
  return out;
}

std::vector<tessera::PushPullItem> PushPullItems(const tessera::Client& client,
                                                 const tessera_push_pull_item_t* items,
                                                 size_t count) {
  std::vector<tessera::PushPullItem> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    out.push_back(
        {FromHandle(client, items[i].tensor), items[i].gradient, items[i].weights, items[i].bytes});
  }
  return out;
}

}  // namespace

extern "C" {

void tessera_free(void* ptr) { std::free(ptr); }
const char* tessera_version(void) { return TESSERA_VERSION; }

// ---- Options ----

tessera_options_t* tessera_options_create(void) {
  return OrAbort([] { return new tessera_options_t; });
}

tessera_options_t* tessera_options_from_env(int argc, const char* const* argv, char** errptr) {
  return Guarded<tessera_options_t*>(errptr, nullptr, [&]() -> tessera_options_t* {
    auto options = tessera::ClientOptions::FromEnv(argc, argv);
    if (SaveError(errptr, options.status())) return nullptr;
    return new tessera_options_t{std::move(*options)};
  });
}

void tessera_options_destroy(tessera_options_t* options) { delete options; }

void tessera_options_set_cluster_json(tessera_options_t* options, const char* json, char** errptr) {
  GuardedVoid(errptr, [&] {
    if (options == nullptr || json == nullptr) {
      SaveError(errptr, BadHandle(options == nullptr ? "options" : "json"));
      return;
    }
    auto spec = tessera::ClusterSpec::FromJson(json);
    if (!SaveError(errptr, spec.status())) options->options.cluster = std::move(*spec);
  });
}

void tessera_options_set_task(tessera_options_t* options, const char* job, int index) {
  OrAbort([&] { options->options.task = {job, index}; });
}

void tessera_options_set_secret(tessera_options_t* options, const char* secret, size_t length) {
  OrAbort([&] { options->options.secret.assign(secret, length); });
}

void tessera_options_set_transport(tessera_options_t* options, const char* transport) {
  OrAbort([&] { options->options.transport = transport; });
}

void tessera_options_set_op_timeout_ms(tessera_options_t* options, int64_t ms) {
  options->options.op_timeout = std::chrono::milliseconds(ms);
}

void tessera_options_set_startup_timeout_ms(tessera_options_t* options, int64_t ms) {
  options->options.startup_timeout = std::chrono::milliseconds(ms);
}

void tessera_options_set_retry_lost_shard_ms(tessera_options_t* options, int64_t ms) {
  options->options.retry_lost_shard_within = std::chrono::milliseconds(ms);
}

void tessera_options_set_heartbeat_ms(tessera_options_t* options, int64_t interval_ms,
                                      int64_t timeout_ms) {
  options->options.heartbeat_interval = std::chrono::milliseconds(interval_ms);
  options->options.heartbeat_timeout = std::chrono::milliseconds(timeout_ms);
}

void tessera_options_set_chunk_bytes(tessera_options_t* options, size_t bytes) {
  options->options.chunk_bytes = bytes;
}

void tessera_options_set_inline_bytes(tessera_options_t* options, size_t bytes) {
  options->options.inline_bytes = bytes;
}

void tessera_options_set_read_only(tessera_options_t* options, int read_only) {
  options->options.read_only = read_only != 0;
}

int tessera_options_num_workers(const tessera_options_t* options) {
  return options->options.cluster.num_workers();
}

int tessera_options_worker_rank(const tessera_options_t* options, char** errptr) {
  return Guarded(errptr, -1, [&] {
    auto rank = options->options.cluster.worker_rank(options->options.task);
    return SaveError(errptr, rank.status()) ? -1 : *rank;
  });
}

// ---- Tensor declarations ----

tessera_tensor_spec_t* tessera_tensor_spec_create(const char* name, int dtype, const int64_t* shape,
                                                  size_t ndims, int rule) {
  return OrAbort([&] {
    auto* s = new tessera_tensor_spec_t;
    s->spec.name = name == nullptr ? "" : name;
    // Unchecked here: Declare names a bad dtype or rule, with the tensor.
    s->spec.dtype = static_cast<tessera::DType>(dtype);
    s->spec.rule = static_cast<tessera::UpdateRule>(rule);
    if (shape != nullptr) s->spec.shape.assign(shape, shape + ndims);
    return s;
  });
}

void tessera_tensor_spec_destroy(tessera_tensor_spec_t* spec) { delete spec; }

void tessera_tensor_spec_set_initial(tessera_tensor_spec_t* spec, const void* data, size_t bytes) {
  OrAbort([&] {
    const auto* p = static_cast<const uint8_t*>(data);
    spec->spec.initial.assign(p, p + bytes);
  });
}

void tessera_tensor_spec_set_initializer(tessera_tensor_spec_t* spec, int kind, double a, double b,
                                         uint64_t seed) {
  tessera::Initializer init;
  // An out-of-range kind stays out of range (declare then names it) rather than
  // wrapping into a valid one.
  init.kind =
      static_cast<tessera::Initializer::Kind>(kind >= 0 && kind <= UINT8_MAX ? kind : UINT8_MAX);
  init.value = a;
  init.low = a;
  init.high = b;
  init.mean = a;
  init.stddev = b;
  init.seed = seed;
  spec->spec.initializer = init;
}

void tessera_tensor_spec_set_hyperparam(tessera_tensor_spec_t* spec, const char* name, double value,
                                        char** errptr) {
  GuardedVoid(errptr, [&] {
    if (spec == nullptr) {
      SaveError(errptr, BadHandle("spec"));
      return;
    }
    tessera::Hyperparams h = spec->spec.hyper;
    if (!SaveError(errptr, SetHyper(h, name, value))) spec->spec.hyper = h;
  });
}

void tessera_tensor_spec_set_async(tessera_tensor_spec_t* spec) {
  spec->spec.mode = tessera::ConsistencyMode::Async();
}

void tessera_tensor_spec_set_sync(tessera_tensor_spec_t* spec, uint32_t replicas_to_aggregate,
                                  uint32_t total_num_replicas, int average) {
  spec->spec.mode =
      tessera::ConsistencyMode::Sync(replicas_to_aggregate, total_num_replicas, average != 0);
}

void tessera_tensor_spec_set_bounded(tessera_tensor_spec_t* spec, uint32_t staleness) {
  spec->spec.mode = tessera::ConsistencyMode::Bounded(staleness);
}

void tessera_tensor_spec_pin_shard(tessera_tensor_spec_t* spec, int ps_task) {
  spec->spec.pinned_shard = ps_task;
}

// ---- Client ----

tessera_client_t* tessera_client_connect(const tessera_options_t* options, char** errptr) {
  return Guarded<tessera_client_t*>(errptr, nullptr, [&]() -> tessera_client_t* {
    if (options == nullptr) {
      SaveError(errptr, BadHandle("options"));
      return nullptr;
    }
    auto client = tessera::Client::Connect(options->options);
    if (SaveError(errptr, client.status())) return nullptr;
    return new tessera_client_t{std::move(*client)};
  });
}

void tessera_client_destroy(tessera_client_t* client) {
  OrAbort([&] { delete client; });
}

int tessera_client_is_chief(const tessera_client_t* client) {
  return client->client->is_chief() ? 1 : 0;
}

int tessera_client_num_shards(const tessera_client_t* client) {
  return client->client->num_shards();
}

int tessera_client_read_only(const tessera_client_t* client) {
  return client->client->read_only() ? 1 : 0;
}

tessera_tensor_t tessera_client_declare(tessera_client_t* client, const tessera_tensor_spec_t* spec,
                                        char** errptr) {
  return Guarded<tessera_tensor_t>(errptr, TESSERA_INVALID_TENSOR, [&] {
    if (client == nullptr || spec == nullptr) {
      SaveError(errptr, BadHandle(client == nullptr ? "client" : "spec"));
      return TESSERA_INVALID_TENSOR;
    }
    auto t = client->client->Declare(spec->spec);
    if (SaveError(errptr, t.status())) return TESSERA_INVALID_TENSOR;
    auto handle = ToHandle(*client->client, *t);
    return SaveError(errptr, handle.status()) ? TESSERA_INVALID_TENSOR : *handle;
  });
}

tessera_tensor_t tessera_client_find(const tessera_client_t* client, const char* name,
                                     char** errptr) {
  return Guarded<tessera_tensor_t>(errptr, TESSERA_INVALID_TENSOR, [&] {
    if (name == nullptr) {
      SaveError(errptr, BadHandle("name"));
      return TESSERA_INVALID_TENSOR;
    }
    auto t = client->client->Find(name);
    if (SaveError(errptr, t.status())) return TESSERA_INVALID_TENSOR;
    auto handle = ToHandle(*client->client, *t);
    return SaveError(errptr, handle.status()) ? TESSERA_INVALID_TENSOR : *handle;
  });
}

void tessera_client_initialize(tessera_client_t* client, char** errptr) {
  GuardedVoid(errptr, [&] { SaveError(errptr, client->client->Initialize()); });
}

void tessera_client_wait_for_init(tessera_client_t* client, int64_t timeout_ms, char** errptr) {
  GuardedVoid(errptr, [&] {
    SaveError(errptr, client->client->WaitForInit(std::chrono::milliseconds(timeout_ms)));
  });
}

tessera_future_t* tessera_client_declare_async(tessera_client_t* client,
                                               const tessera_tensor_spec_t* spec,
                                               tessera_tensor_t* tensor) {
  return OrAbort([&] {
    auto out = std::make_shared<tessera::Tensor>();
    // No spec declares a tensor without a name, which the future refuses.
    tessera::Future f =
        client->client->DeclareAsync(spec ? spec->spec : tessera::TensorSpec{}, out.get());
    if (tensor != nullptr) {
      f.Then([out, tensor, c = client->client.get()](const Status& st) {
        // Past the handle's index bits (no cluster's default limit reaches
        // them) it is the invalid handle, which every call refuses.
        if (st.ok()) *tensor = ToHandle(*c, *out).value_or(TESSERA_INVALID_TENSOR);
      });
    }
    return new tessera_future_t{std::move(f)};
  });
}

tessera_future_t* tessera_client_initialize_async(tessera_client_t* client) {
  return OrAbort([&] { return new tessera_future_t{client->client->InitializeAsync()}; });
}

tessera_future_t* tessera_client_wait_for_init_async(tessera_client_t* client, int64_t timeout_ms) {
  return OrAbort([&] {
    return new tessera_future_t{
        client->client->WaitForInitAsync(std::chrono::milliseconds(timeout_ms))};
  });
}

int tessera_client_restored_step(const tessera_client_t* client, uint64_t* step) {
  auto restored = client->client->restored_step();
  if (!restored) return 0;
  if (step != nullptr) *step = *restored;
  return 1;
}

int tessera_client_start_step(const tessera_client_t* client, uint64_t* step) {
  auto start = client->client->start_step();
  if (!start) return 0;
  if (step != nullptr) *step = *start;
  return 1;
}

// The blocking calls wait at once: the calling thread issues the call
// itself (CallOptions::caller_waits).
void tessera_client_push_with_options(tessera_client_t* client, const tessera_push_item_t* items,
                                      size_t count, const tessera_push_options_t* options,
                                      char** errptr) {
  GuardedVoid(errptr, [&] {
    if (SaveError(errptr, BadCall(client, items, count))) return;
    auto push_options = PushOptionsOf(options);
    if (SaveError(errptr, push_options.status())) return;
    SaveError(errptr,
              client->client->Push(PushItems(*client->client, items, count), *push_options));
  });
}

void tessera_client_pull(tessera_client_t* client, const tessera_pull_item_t* items, size_t count,
                         char** errptr) {
  GuardedVoid(errptr, [&] {
    if (SaveError(errptr, BadCall(client, items, count))) return;
    const tessera::CallOptions call{.caller_waits = true};
    SaveError(errptr,
              client->client->PullAsync(PullItems(*client->client, items, count), call).Wait());
  });
}

void tessera_client_push_pull(tessera_client_t* client, const tessera_push_pull_item_t* items,
                              size_t count, char** errptr) {
  GuardedVoid(errptr, [&] {
    if (SaveError(errptr, BadCall(client, items, count))) return;
    const tessera::CallOptions call{.caller_waits = true};
    SaveError(
        errptr,
        client->client->PushPullAsync(PushPullItems(*client->client, items, count), call).Wait());
  });
}

tessera_future_t* tessera_client_push_async_with_options(tessera_client_t* client,
                                                         const tessera_push_item_t* items,
                                                         size_t count,
                                                         const tessera_push_options_t* options) {
  return OrAbort([&] {
    if (auto bad = BadCall(client, items, count); !bad.ok()) {
      return new tessera_future_t{tessera::Future::Failed(bad)};
    }
    auto push_options = PushOptionsOf(options);
    if (!push_options.ok())
      return new tessera_future_t{tessera::Future::Failed(push_options.status())};
    return new tessera_future_t{
        client->client->PushAsync(PushItems(*client->client, items, count), *push_options)};
  });
}

tessera_future_t* tessera_client_pull_async(tessera_client_t* client,
                                            const tessera_pull_item_t* items, size_t count) {
  return tessera_client_pull_async_on_stream(client, items, count, nullptr);
}

tessera_future_t* tessera_client_push_pull_async(tessera_client_t* client,
                                                 const tessera_push_pull_item_t* items,
                                                 size_t count) {
  return tessera_client_push_pull_async_on_stream(client, items, count, nullptr);
}

tessera_future_t* tessera_client_pull_async_on_stream(tessera_client_t* client,
                                                      const tessera_pull_item_t* items,
                                                      size_t count, void* cuda_stream) {
  return OrAbort([&] {
    if (auto bad = BadCall(client, items, count); !bad.ok()) {
      return new tessera_future_t{tessera::Future::Failed(bad)};
    }
    return new tessera_future_t{client->client->PullAsync(PullItems(*client->client, items, count),
                                                          tessera::CallOptions{cuda_stream})};
  });
}

tessera_future_t* tessera_client_push_pull_async_on_stream(tessera_client_t* client,
                                                           const tessera_push_pull_item_t* items,
                                                           size_t count, void* cuda_stream) {
  return OrAbort([&] {
    if (auto bad = BadCall(client, items, count); !bad.ok()) {
      return new tessera_future_t{tessera::Future::Failed(bad)};
    }
    return new tessera_future_t{client->client->PushPullAsync(
        PushPullItems(*client->client, items, count), tessera::CallOptions{cuda_stream})};
  });
}

// The push calls before tessera_push_options_t, kept for one release.
namespace {
tessera_push_options_t WithStep(uint64_t step, void* cuda_stream) {
  return {step != TESSERA_NO_STEP ? 1 : 0, step, cuda_stream};
}
}  // namespace

void tessera_client_push(tessera_client_t* client, const tessera_push_item_t* items, size_t count,
                         uint64_t step, char** errptr) {
  const tessera_push_options_t options = WithStep(step, nullptr);
  tessera_client_push_with_options(client, items, count, &options, errptr);
}

tessera_future_t* tessera_client_push_async(tessera_client_t* client,
                                            const tessera_push_item_t* items, size_t count,
                                            uint64_t step) {
  const tessera_push_options_t options = WithStep(step, nullptr);
  return tessera_client_push_async_with_options(client, items, count, &options);
}

tessera_future_t* tessera_client_push_async_on_stream(tessera_client_t* client,
                                                      const tessera_push_item_t* items,
                                                      size_t count, uint64_t step,
                                                      void* cuda_stream) {
  const tessera_push_options_t options = WithStep(step, cuda_stream);
  return tessera_client_push_async_with_options(client, items, count, &options);
}

void tessera_client_set_hyperparam(tessera_client_t* client, tessera_tensor_t tensor,
                                   const char* name, double value, char** errptr) {
  GuardedVoid(errptr, [&] {
    auto info = client->client->info(FromHandle(*client->client, tensor));
    if (SaveError(errptr, info.status())) return;
    tessera::Hyperparams h = info->hyper;
    if (SaveError(errptr, SetHyper(h, name, value))) return;
    SaveError(errptr, client->client->SetHyperparams(FromHandle(*client->client, tensor), h));
  });
}

namespace {
tessera::Result<tessera::Client::StateSlot> StateSlotOf(int slot) {
  if (slot < 0 || slot > 2) {
    return tessera::Status::InvalidArgument("state slot " + std::to_string(slot) +
                                            ": 0, 1 or 2 (the master copy)");
  }
  return static_cast<tessera::Client::StateSlot>(slot);
}
}  // namespace

size_t tessera_client_read_optimizer_state(tessera_client_t* client, tessera_tensor_t tensor,
                                           int slot, void* out, size_t capacity, uint64_t* updates,
                                           char** errptr) {
  return Guarded<size_t>(errptr, 0, [&]() -> size_t {
    auto which = StateSlotOf(slot);
    if (SaveError(errptr, which.status())) return 0;
    auto state = client->client->ReadOptimizerState(FromHandle(*client->client, tensor), *which);
    if (SaveError(errptr, state.status())) return 0;
    if (state->bytes.size() > capacity || (out == nullptr && !state->bytes.empty())) {
      SaveError(errptr, tessera::Status::InvalidArgument(
                            "optimizer state of " + std::to_string(state->bytes.size()) +
                            " bytes does not fit " + std::to_string(capacity)));
      return 0;
    }
    if (!state->bytes.empty()) std::memcpy(out, state->bytes.data(), state->bytes.size());
    if (updates != nullptr) *updates = state->updates;
    return state->bytes.size();
  });
}

void tessera_client_write_optimizer_state(tessera_client_t* client, tessera_tensor_t tensor,
                                          int slot, const void* data, size_t bytes,
                                          uint64_t updates, char** errptr) {
  GuardedVoid(errptr, [&] {
    auto which = StateSlotOf(slot);
    if (SaveError(errptr, which.status())) return;
    if (data == nullptr && bytes > 0) {
      SaveError(errptr, tessera::Status::InvalidArgument("optimizer state: data is NULL"));
      return;
    }
    tessera::Client::OptimizerState state;
    const auto* from = static_cast<const uint8_t*>(data);
    if (bytes > 0) state.bytes.assign(from, from + bytes);
    state.updates = updates;
    SaveError(errptr, client->client->WriteOptimizerState(FromHandle(*client->client, tensor),
                                                          *which, state));
  });
}

uint64_t tessera_client_global_step(tessera_client_t* client, char** errptr) {
  return Guarded<uint64_t>(errptr, 0, [&]() -> uint64_t {
    auto step = client->client->GlobalStep();
    return SaveError(errptr, step.status()) ? 0 : *step;
  });
}

uint64_t tessera_client_save_checkpoint(tessera_client_t* client, int64_t timeout_ms, char** path,
                                        char** errptr) {
  return Guarded<uint64_t>(errptr, 0, [&]() -> uint64_t {
    auto ckpt = client->client->SaveCheckpoint(std::chrono::milliseconds(timeout_ms));
    if (SaveError(errptr, ckpt.status())) return 0;
    if (path != nullptr) *path = CopyString(ckpt->path);
    return ckpt->global_step;
  });
}

void tessera_client_counters(const tessera_client_t* client, tessera_counters_t* counters) {
  const tessera::ClientCounters c = client->client->counters();
  *counters = {c.messages_sent,
               c.message_bytes_sent,
               c.messages_received,
               c.message_bytes_received,
               c.puts,
               c.put_bytes,
               c.gets,
               c.get_bytes,
               c.chunks_dropped_stale,
               c.chunks_dropped_duplicate,
               c.cuda_ipc_bytes,
               c.host_staged_bytes,
               c.gpu_inline_bytes};
}

// ---- Tensor info ----

tessera_tensor_info_t* tessera_client_tensor_info(const tessera_client_t* client,
                                                  tessera_tensor_t tensor, char** errptr) {
  return Guarded<tessera_tensor_info_t*>(errptr, nullptr, [&]() -> tessera_tensor_info_t* {
    auto info = client->client->info(FromHandle(*client->client, tensor));
    if (SaveError(errptr, info.status())) return nullptr;
    return new tessera_tensor_info_t{std::move(*info)};
  });
}

void tessera_tensor_info_destroy(tessera_tensor_info_t* info) { delete info; }
const char* tessera_tensor_info_name(const tessera_tensor_info_t* info) {
  return info->info.name.c_str();
}
int tessera_tensor_info_dtype(const tessera_tensor_info_t* info) {
  return static_cast<int>(info->info.dtype);
}
int tessera_tensor_info_rule(const tessera_tensor_info_t* info) {
  return static_cast<int>(info->info.rule);
}
size_t tessera_tensor_info_ndims(const tessera_tensor_info_t* info) {
  return info->info.shape.size();
}
int64_t tessera_tensor_info_dim(const tessera_tensor_info_t* info, size_t i) {
  return i < info->info.shape.size() ? info->info.shape[i] : -1;
}
uint64_t tessera_tensor_info_bytes(const tessera_tensor_info_t* info) { return info->info.bytes; }
size_t tessera_tensor_info_num_chunks(const tessera_tensor_info_t* info) {
  return info->info.shards.size();
}
int tessera_tensor_info_chunk_shard(const tessera_tensor_info_t* info, size_t i) {
  return i < info->info.shards.size() ? info->info.shards[i] : -1;
}

// ---- Futures ----

void tessera_future_destroy(tessera_future_t* future) { delete future; }

int tessera_future_ready(const tessera_future_t* future) { return future->future.ready() ? 1 : 0; }

int tessera_future_cancel(const tessera_future_t* future) {
  return future->future.Cancel() ? 1 : 0;
}

void tessera_future_wait(const tessera_future_t* future, char** errptr) {
  GuardedVoid(errptr, [&] {
    SaveError(errptr, future == nullptr ? BadHandle("future") : future->future.Wait());
  });
}

int tessera_future_wait_for(const tessera_future_t* future, int64_t timeout_ms, char** errptr) {
  return Guarded(errptr, 0, [&] {
    Status st = future->future.WaitFor(std::chrono::milliseconds(timeout_ms));
    if (!future->future.ready()) return 0;
    SaveError(errptr, st);
    return 1;
  });
}

void tessera_future_wait_all(tessera_future_t* const* futures, size_t count, char** errptr) {
  GuardedVoid(errptr, [&] {
    std::vector<tessera::Future> all;
    all.reserve(count);
    for (size_t i = 0; i < count; ++i) all.push_back(futures[i]->future);
    SaveError(errptr, tessera::WaitAll(all));
  });
}

void tessera_future_then(const tessera_future_t* future, void (*fn)(void* arg, const char* error),
                         void* arg) {
  OrAbort([&] {
    future->future.Then([fn, arg](const Status& st) {
      if (st.ok()) {
        fn(arg, nullptr);
      } else {
        const std::string text = st.ToString();
        fn(arg, text.c_str());
      }
    });
  });
}

size_t tessera_future_num_dropped(const tessera_future_t* future) {
  return OrAbort([&] { return future->future.dropped().size(); });
}

}  // extern "C"
