// tessera._tessera: the nanobind extension behind the `tessera` package
// (python/tessera). This file binds the value types (dtypes, update rules,
// consistency modes, hyper-parameters, initializers, specs, options,
// counters); client_binding.cc the client's calls.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "python/buffers.h"
#include "python/client_binding.h"
#include "python/errors.h"
#include "python/server_binding.h"
#include "tessera/client.h"
#include "tessera_config.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessera::python {
namespace {

double Seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1e3; }

std::chrono::milliseconds FromSeconds(double s, const char* field) {
  if (!(s >= 0)) ThrowIfError(Status::InvalidArgument(std::string(field) + " must be >= 0 s"));
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0));
}

// A seconds-valued property over one of ClientOptions' millisecond fields.
template <std::chrono::milliseconds ClientOptions::*Field>
void SecondsField(nb::class_<ClientOptions>& cls, const char* name) {
  cls.def_prop_rw(
      name, [](const ClientOptions& o) { return Seconds(o.*Field); },
      [name](ClientOptions& o, double s) { o.*Field = FromSeconds(s, name); }, "seconds");
}

void BindEnums(nb::module_& m) {
  nb::enum_<DType>(m, "DType")
      .value("F32", DType::kF32)
      .value("F64", DType::kF64)
      .value("F16", DType::kF16)
      .value("BF16", DType::kBF16)
      .value("I32", DType::kI32)
      .value("I64", DType::kI64);
  nb::enum_<UpdateRule>(m, "UpdateRule")
      .value("ASSIGN", UpdateRule::kAssign)
      .value("ADD", UpdateRule::kAdd)
      .value("SGD", UpdateRule::kSgd)
      .value("MOMENTUM", UpdateRule::kMomentum)
      .value("ADAM", UpdateRule::kAdam)
      .value("ADAMW", UpdateRule::kAdamW)
      .value("ADAGRAD", UpdateRule::kAdagrad);
  nb::enum_<Consistency>(m, "Consistency")
      .value("ASYNC", Consistency::kAsync)
      .value("SYNC", Consistency::kSync)
      .value("BOUNDED", Consistency::kBounded);
}

void BindValueTypes(nb::module_& m) {
  nb::class_<Hyperparams>(m, "Hyperparams",
                          "Hyper-parameters of the optimizer rules; PyTorch's defaults except "
                          "the learning rate.")
      .def(nb::init<>())
      .def_rw("learning_rate", &Hyperparams::learning_rate)
      .def_rw("weight_decay", &Hyperparams::weight_decay)
      .def_rw("momentum", &Hyperparams::momentum)
      .def_rw("nesterov", &Hyperparams::nesterov)
      .def_rw("beta1", &Hyperparams::beta1)
      .def_rw("beta2", &Hyperparams::beta2)
      .def_rw("epsilon", &Hyperparams::epsilon)
      .def_rw("initial_accumulator", &Hyperparams::initial_accumulator)
      .def("validate", [](const Hyperparams& h) { ThrowIfError(h.Validate()); })
      .def("__eq__", [](const Hyperparams& a, const Hyperparams& b) { return a == b; });

  nb::class_<ConsistencyMode>(m, "ConsistencyMode")
      .def(nb::init<>())
      .def_rw("kind", &ConsistencyMode::kind)
      .def_rw("replicas_to_aggregate", &ConsistencyMode::replicas_to_aggregate)
      .def_rw("total_num_replicas", &ConsistencyMode::total_num_replicas)
      .def_rw("average", &ConsistencyMode::average)
      .def_rw("staleness", &ConsistencyMode::staleness);

  nb::class_<Initializer> init(m, "Initializer");
  nb::enum_<Initializer::Kind>(init, "Kind")
      .value("ZEROS", Initializer::Kind::kZeros)
      .value("CONSTANT", Initializer::Kind::kConstant)
      .value("UNIFORM", Initializer::Kind::kUniform)
      .value("NORMAL", Initializer::Kind::kNormal)
      .value("TRUNCATED_NORMAL", Initializer::Kind::kTruncatedNormal)
      .value("GLOROT_UNIFORM", Initializer::Kind::kGlorotUniform)
      .value("GLOROT_NORMAL", Initializer::Kind::kGlorotNormal);
  init.def(nb::init<>())
      .def_rw("kind", &Initializer::kind)
      .def_rw("value", &Initializer::value)
      .def_rw("low", &Initializer::low)
      .def_rw("high", &Initializer::high)
      .def_rw("mean", &Initializer::mean)
      .def_rw("stddev", &Initializer::stddev)
      .def_rw("seed", &Initializer::seed);

  nb::class_<TensorSpec>(m, "TensorSpec")
      .def(nb::init<>())
      .def_rw("name", &TensorSpec::name)
      .def_rw("dtype", &TensorSpec::dtype)
      .def_rw("shape", &TensorSpec::shape)
      .def_rw("rule", &TensorSpec::rule)
      .def_rw("pinned_shard", &TensorSpec::pinned_shard)
      .def_rw("hyper", &TensorSpec::hyper)
      .def_rw("mode", &TensorSpec::mode)
      .def_rw("initializer", &TensorSpec::initializer)
      .def(
          "set_initial",
          [](TensorSpec& s, nb::handle array) {
            // Copied: the chief keeps the initial value until it initialises.
            Buffer b = BufferFrom(array, Access::kRead, "the initial value", s.name);
            if (b.memory != BufferMemory::kHost) {
              ThrowIfError(Status::InvalidArgument("the initial value of tensor '" + s.name +
                                                   "' must be in host memory"));
            }
            const auto* p = static_cast<const uint8_t*>(b.data);
            s.initial.assign(p, p + b.bytes);
          },
          "array"_a);

  nb::class_<TensorInfo>(m, "TensorInfo")
      .def_ro("name", &TensorInfo::name)
      .def_ro("dtype", &TensorInfo::dtype)
      .def_ro("shape", &TensorInfo::shape)
      .def_ro("rule", &TensorInfo::rule)
      .def_ro("bytes", &TensorInfo::bytes)
      .def_ro("shards", &TensorInfo::shards)
      .def_prop_ro("chunks",
                   [](const TensorInfo& i) {
                     std::vector<std::tuple<uint64_t, uint64_t>> out;
                     for (const auto& c : i.chunks) out.emplace_back(c.elem_offset, c.elem_count);
                     return out;
                   })
      .def_ro("mode", &TensorInfo::mode)
      .def_ro("hyper", &TensorInfo::hyper);

  nb::class_<ClientCounters>(m, "Counters")
      .def_ro("messages_sent", &ClientCounters::messages_sent)
      .def_ro("message_bytes_sent", &ClientCounters::message_bytes_sent)
      .def_ro("messages_received", &ClientCounters::messages_received)
      .def_ro("message_bytes_received", &ClientCounters::message_bytes_received)
      .def_ro("puts", &ClientCounters::puts)
      .def_ro("put_bytes", &ClientCounters::put_bytes)
      .def_ro("gets", &ClientCounters::gets)
      .def_ro("get_bytes", &ClientCounters::get_bytes)
      .def_ro("chunks_dropped_stale", &ClientCounters::chunks_dropped_stale)
      .def_ro("chunks_dropped_duplicate", &ClientCounters::chunks_dropped_duplicate)
      .def_ro("cuda_ipc_bytes", &ClientCounters::cuda_ipc_bytes)
      .def_ro("host_staged_bytes", &ClientCounters::host_staged_bytes)
      .def_ro("gpu_inline_bytes", &ClientCounters::gpu_inline_bytes)
      .def_ro("cuda_ipc_shards", &ClientCounters::cuda_ipc_shards)
      .def_ro("protected_sessions", &ClientCounters::protected_sessions);
}

void BindOptions(nb::module_& m) {
  nb::class_<ClientOptions> options(m, "ClientOptions");
  options.def(nb::init<>())
      .def_static(
          "from_env",
          [](const std::vector<std::string>& argv) {
            std::vector<const char*> args;
            args.reserve(argv.size());
            for (const auto& a : argv) args.push_back(a.c_str());
            return ValueOrThrow(ClientOptions::FromEnv(static_cast<int>(args.size()), args.data()));
          },
          "argv"_a = std::vector<std::string>{},
          "TF1 flags in argv (argv[0] is the program), else TF_CONFIG; TESSERA_SECRET or "
          "TESSERA_SECRET_FILE; TESSERA_TRANSPORT; TESSERA_SESSION_PROTECTION; "
          "TESSERA_LOG_LEVEL.")
      .def_prop_rw(
          "cluster_json", [](const ClientOptions& o) { return o.cluster.ToJson(); },
          [](ClientOptions& o, const std::string& json) {
            o.cluster = ValueOrThrow(ClusterSpec::FromJson(json));
          })
      .def_prop_rw(
          "task", [](const ClientOptions& o) { return std::make_tuple(o.task.job, o.task.index); },
          [](ClientOptions& o, const std::tuple<std::string, int>& t) {
            o.task = {std::get<0>(t), std::get<1>(t)};
          })
      .def_prop_rw(
          "secret", [](const ClientOptions&) { return std::string("<hidden>"); },
          [](ClientOptions& o, const std::string& s) { o.secret = s; })
      .def_rw("allow_weak_secret", &ClientOptions::allow_weak_secret)
      .def_rw("read_only", &ClientOptions::read_only,
              "A reader (evaluator, inference): looks tensors up and pulls, never writes.")
      .def_rw("transport", &ClientOptions::transport)
      .def_prop_rw(
          "session_protection",
          [](const ClientOptions& o) {
            return std::string(SessionProtectionName(o.session_protection));
          },
          [](ClientOptions& o, const std::string& name) {
            auto p = ParseSessionProtection(name);
            if (!p.ok()) throw nb::value_error(p.status().message().c_str());
            o.session_protection = *p;
          },
          "auto (encrypted off the host, not on loopback), on, integrity or off")
      .def_rw("chunk_bytes", &ClientOptions::chunk_bytes)
      .def_rw("placement", &ClientOptions::placement)
      .def_rw("inline_bytes", &ClientOptions::inline_bytes)
      .def_rw("busy_poll", &ClientOptions::busy_poll)
      .def_rw("cuda_ipc", &ClientOptions::cuda_ipc)
      .def_rw("allow_host_staging", &ClientOptions::allow_host_staging)
      .def_rw("cuda_device", &ClientOptions::cuda_device);
  SecondsField<&ClientOptions::startup_timeout>(options, "startup_timeout");
  SecondsField<&ClientOptions::report_interval>(options, "report_interval");
  SecondsField<&ClientOptions::op_timeout>(options, "op_timeout");
  SecondsField<&ClientOptions::heartbeat_interval>(options, "heartbeat_interval");
  SecondsField<&ClientOptions::heartbeat_timeout>(options, "heartbeat_timeout");
  SecondsField<&ClientOptions::retry_lost_shard_within>(options, "retry_lost_shard_within");
}

}  // namespace
}  // namespace tessera::python

NB_MODULE(_tessera, m) {
  using namespace tessera::python;
  m.doc() = "Tessera's C++ client (tessera::Client) for the tessera package.";
  m.attr("__version__") = TESSERA_VERSION;
  RegisterErrors(m);
  BindEnums(m);
  BindValueTypes(m);
  BindOptions(m);
  BindClient(m);
  BindServer(m);
}
