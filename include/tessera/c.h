/* The C API: Tessera's client for C and for other languages' foreign
 * function interfaces, in the style of LevelDB's c.h.
 *
 *   char* err = NULL;
 *   tessera_options_t* o = tessera_options_from_env(argc, argv, &err);
 *   tessera_client_t* c = tessera_client_connect(o, &err);
 *   int64_t shape[] = {1024};
 *   tessera_tensor_spec_t* s = tessera_tensor_spec_create("w", TESSERA_F32, shape, 1,
 *                                                         TESSERA_RULE_ADD);
 *   tessera_tensor_t w = tessera_client_declare(c, s, &err);
 *   if (tessera_client_is_chief(c)) tessera_client_initialize(c, &err);
 *   else tessera_client_wait_for_init(c, 60000, &err);
 *   tessera_push_item_t push = {w, grad, sizeof grad};
 *   tessera_client_push_with_options(c, &push, 1, NULL, &err);
 *
 * Conventions:
 *  - Handles are opaque; each *_create, *_connect and *_async result is
 *    released with its *_destroy.
 *  - A call that can fail takes `char** errptr` last. On failure it stores a
 *    malloc'ed message ("Unavailable: ps task 1 ...") there, freeing what
 *    was there first; release it with tessera_free. On success it leaves
 *    *errptr as it was, so one NULL-initialised pointer can follow a series
 *    of calls.
 *  - No C++ exception crosses this API: an allocation failure inside is
 *    reported through errptr where there is one, and aborts otherwise.
 *  - Buffers given to an asynchronous call must stay valid and unchanged
 *    until its future completes: bytes move one-sided from and into them.
 *  - A client may be shared by threads. */
#ifndef TESSERA_C_H_
#define TESSERA_C_H_

#include <stddef.h>
#include <stdint.h>

#include "tessera/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tessera_options_t tessera_options_t;
typedef struct tessera_client_t tessera_client_t;
typedef struct tessera_tensor_spec_t tessera_tensor_spec_t;
typedef struct tessera_tensor_info_t tessera_tensor_info_t;
typedef struct tessera_future_t tessera_future_t;

/* A declared tensor, valid for the life of the client that declared or
 * found it. Opaque: it carries its client's generation beside the tensor's
 * index, so another client (a later one in a closed one's place among them)
 * refuses it, naming it, instead of taking it for a tensor of its own. */
typedef uint32_t tessera_tensor_t;
#define TESSERA_INVALID_TENSOR UINT32_MAX
/* A push without a step (async tensors). */
#define TESSERA_NO_STEP UINT64_MAX

/* The values of tessera::DType and tessera::UpdateRule. */
enum {
  TESSERA_F32 = 1,
  TESSERA_F64 = 2,
  TESSERA_F16 = 3,
  TESSERA_BF16 = 4,
  TESSERA_I32 = 5,
  TESSERA_I64 = 6,
};
enum {
  TESSERA_RULE_ASSIGN = 1,
  TESSERA_RULE_ADD = 2,
  TESSERA_RULE_SGD = 3,
  TESSERA_RULE_MOMENTUM = 4,
  TESSERA_RULE_ADAM = 5,
  TESSERA_RULE_ADAMW = 6,
  TESSERA_RULE_ADAGRAD = 7,
};
/* tessera::Initializer::Kind */
enum {
  TESSERA_INIT_ZEROS = 0,
  TESSERA_INIT_CONSTANT = 1, /* a = the value */
  TESSERA_INIT_UNIFORM = 2,  /* a, b = low, high */
  TESSERA_INIT_NORMAL = 3,   /* a, b = mean, stddev */
  TESSERA_INIT_TRUNCATED_NORMAL = 4,
  TESSERA_INIT_GLOROT_UNIFORM = 5,
  TESSERA_INIT_GLOROT_NORMAL = 6,
};

/* The items of a call: plain structs, so that a batch is one array. */
typedef struct {
  tessera_tensor_t tensor;
  const void* data;
  size_t bytes;
} tessera_push_item_t;

/* How a push is tagged and ordered (tessera::PushOptions). All zero (as
 * `tessera_push_options_t opts = {0};` makes it) is a push without a step,
 * not ordered on a stream. */
typedef struct {
  int has_step;  /* 1: `step` is the worker's step (sync and bounded tensors need one) */
  uint64_t step; /* steps count from 0 */
  /* A cudaStream_t, or NULL: the call starts once the work enqueued on the
   * stream before it is done, and the stream's later work waits until the
   * call completed; no host synchronisation. Without CUDA, a GPU or stream
   * memory operations the call fails saying which. */
  void* cuda_stream;
} tessera_push_options_t;

typedef struct {
  tessera_tensor_t tensor;
  void* data;
  size_t bytes;
  uint64_t min_version; /* 0 or 1: once initialised */
  uint64_t min_step;    /* sync: after pushing step t, pull with t + 1 */
} tessera_pull_item_t;

typedef struct {
  tessera_tensor_t tensor;
  const void* gradient;
  void* weights;
  size_t bytes;
} tessera_push_pull_item_t;

typedef struct {
  uint64_t messages_sent, message_bytes_sent;
  uint64_t messages_received, message_bytes_received;
  uint64_t puts, put_bytes, gets, get_bytes;
  uint64_t chunks_dropped_stale, chunks_dropped_duplicate;
  uint64_t cuda_ipc_bytes, host_staged_bytes, gpu_inline_bytes;
} tessera_counters_t;

TESSERA_EXPORT void tessera_free(void* ptr);
/* "0.1.0" */
TESSERA_EXPORT const char* tessera_version(void);

/* ---- Options (tessera::ClientOptions) ---- */
TESSERA_EXPORT tessera_options_t* tessera_options_create(void);
/* TF_CONFIG or TensorFlow 1's flags in argv, TESSERA_SECRET(_FILE),
 * TESSERA_TRANSPORT, TESSERA_LOG_LEVEL: ClientOptions::FromEnv. NULL on error. */
TESSERA_EXPORT tessera_options_t* tessera_options_from_env(int argc, const char* const* argv,
                                                           char** errptr);
TESSERA_EXPORT void tessera_options_destroy(tessera_options_t* options);
/* {"ps": ["host:port", ...], "worker": [...]} */
TESSERA_EXPORT void tessera_options_set_cluster_json(tessera_options_t* options, const char* json,
                                                     char** errptr);
TESSERA_EXPORT void tessera_options_set_task(tessera_options_t* options, const char* job,
                                             int index);
TESSERA_EXPORT void tessera_options_set_secret(tessera_options_t* options, const char* secret,
                                               size_t length);
/* "tcp", "ucx", "verbs" or "auto" */
TESSERA_EXPORT void tessera_options_set_transport(tessera_options_t* options,
                                                  const char* transport);
TESSERA_EXPORT void tessera_options_set_op_timeout_ms(tessera_options_t* options, int64_t ms);
TESSERA_EXPORT void tessera_options_set_startup_timeout_ms(tessera_options_t* options, int64_t ms);
/* ClientOptions::retry_lost_shard_within: pulls and sync pushes whose ps task
 * was lost are issued again once it is back (restarted in place), for up to
 * `ms` after they failed; 0 (the default) retries nothing. */
TESSERA_EXPORT void tessera_options_set_retry_lost_shard_ms(tessera_options_t* options, int64_t ms);
TESSERA_EXPORT void tessera_options_set_heartbeat_ms(tessera_options_t* options,
                                                     int64_t interval_ms, int64_t timeout_ms);
TESSERA_EXPORT void tessera_options_set_chunk_bytes(tessera_options_t* options, size_t bytes);
TESSERA_EXPORT void tessera_options_set_inline_bytes(tessera_options_t* options, size_t bytes);
/* 1: a read-only client (an evaluator, an inference reader) that looks up
 * tensors and pulls, and never writes; its secret may be the reader key. */
TESSERA_EXPORT void tessera_options_set_read_only(tessera_options_t* options, int read_only);
/* Where this task stands in the cluster, to split the data by: the number
 * of workers (the chief counts as one) and this worker's rank among them
 * (the chief is 0); -1 and an error when the task is not a worker. */
TESSERA_EXPORT int tessera_options_num_workers(const tessera_options_t* options);
TESSERA_EXPORT int tessera_options_worker_rank(const tessera_options_t* options, char** errptr);

/* ---- Tensor declarations (tessera::TensorSpec) ---- */
TESSERA_EXPORT tessera_tensor_spec_t* tessera_tensor_spec_create(const char* name, int dtype,
                                                                 const int64_t* shape, size_t ndims,
                                                                 int rule);
TESSERA_EXPORT void tessera_tensor_spec_destroy(tessera_tensor_spec_t* spec);
/* The chief's initial value (raw bytes, copied). */
TESSERA_EXPORT void tessera_tensor_spec_set_initial(tessera_tensor_spec_t* spec, const void* data,
                                                    size_t bytes);
TESSERA_EXPORT void tessera_tensor_spec_set_initializer(tessera_tensor_spec_t* spec, int kind,
                                                        double a, double b, uint64_t seed);
/* learning_rate, weight_decay, momentum, nesterov (0/1), beta1, beta2,
 * epsilon, initial_accumulator; an unknown name is an error. */
TESSERA_EXPORT void tessera_tensor_spec_set_hyperparam(tessera_tensor_spec_t* spec,
                                                       const char* name, double value,
                                                       char** errptr);
TESSERA_EXPORT void tessera_tensor_spec_set_async(tessera_tensor_spec_t* spec);
/* 0s mean every worker of the cluster. */
TESSERA_EXPORT void tessera_tensor_spec_set_sync(tessera_tensor_spec_t* spec,
                                                 uint32_t replicas_to_aggregate,
                                                 uint32_t total_num_replicas, int average);
TESSERA_EXPORT void tessera_tensor_spec_set_bounded(tessera_tensor_spec_t* spec,
                                                    uint32_t staleness);
TESSERA_EXPORT void tessera_tensor_spec_pin_shard(tessera_tensor_spec_t* spec, int ps_task);

/* ---- Client (tessera::Client) ---- */
/* Waits (startup timeout) for every ps task. NULL on error. */
TESSERA_EXPORT tessera_client_t* tessera_client_connect(const tessera_options_t* options,
                                                        char** errptr);
TESSERA_EXPORT void tessera_client_destroy(tessera_client_t* client);
TESSERA_EXPORT int tessera_client_is_chief(const tessera_client_t* client);
TESSERA_EXPORT int tessera_client_num_shards(const tessera_client_t* client);
TESSERA_EXPORT int tessera_client_read_only(const tessera_client_t* client);
TESSERA_EXPORT tessera_tensor_t tessera_client_declare(tessera_client_t* client,
                                                       const tessera_tensor_spec_t* spec,
                                                       char** errptr);
TESSERA_EXPORT tessera_tensor_t tessera_client_find(const tessera_client_t* client,
                                                    const char* name, char** errptr);
TESSERA_EXPORT void tessera_client_initialize(tessera_client_t* client, char** errptr);
TESSERA_EXPORT void tessera_client_wait_for_init(tessera_client_t* client, int64_t timeout_ms,
                                                 char** errptr);
/* The control calls without waiting: they run one at a time in the order
 * made (the blocking ones among them), and one still queued may be
 * cancelled. *tensor (may be NULL; it must outlive the future) gets the
 * handle once the future completed without error. Never NULL. */
TESSERA_EXPORT tessera_future_t* tessera_client_declare_async(tessera_client_t* client,
                                                              const tessera_tensor_spec_t* spec,
                                                              tessera_tensor_t* tensor);
TESSERA_EXPORT tessera_future_t* tessera_client_initialize_async(tessera_client_t* client);
TESSERA_EXPORT tessera_future_t* tessera_client_wait_for_init_async(tessera_client_t* client,
                                                                    int64_t timeout_ms);
/* 1 and *step when the cluster resumed from a checkpoint, else 0. */
TESSERA_EXPORT int tessera_client_restored_step(const tessera_client_t* client, uint64_t* step);
/* 1 and *step once initialize or wait_for_init returned, else 0: the step to
 * tag this worker's first push of its sync and bounded tensors with (see
 * Client::start_step). */
TESSERA_EXPORT int tessera_client_start_step(const tessera_client_t* client, uint64_t* step);

/* options: NULL for none (see tessera_push_options_t). */
TESSERA_EXPORT void tessera_client_push_with_options(tessera_client_t* client,
                                                     const tessera_push_item_t* items, size_t count,
                                                     const tessera_push_options_t* options,
                                                     char** errptr);
TESSERA_EXPORT void tessera_client_pull(tessera_client_t* client, const tessera_pull_item_t* items,
                                        size_t count, char** errptr);
TESSERA_EXPORT void tessera_client_push_pull(tessera_client_t* client,
                                             const tessera_push_pull_item_t* items, size_t count,
                                             char** errptr);
/* The same, returning at once; the items array may be freed on return, the
 * buffers it names may not. Never NULL. */
TESSERA_EXPORT tessera_future_t* tessera_client_push_async_with_options(
    tessera_client_t* client, const tessera_push_item_t* items, size_t count,
    const tessera_push_options_t* options);
TESSERA_EXPORT tessera_future_t* tessera_client_pull_async(tessera_client_t* client,
                                                           const tessera_pull_item_t* items,
                                                           size_t count);
TESSERA_EXPORT tessera_future_t* tessera_client_push_pull_async(
    tessera_client_t* client, const tessera_push_pull_item_t* items, size_t count);
/* The same, ordered on a CUDA stream (a cudaStream_t): the call starts once
 * the work enqueued on the stream before it is done, and the stream's later
 * work waits until the call completed; no host synchronisation. Without
 * CUDA, a GPU or stream memory operations the future fails saying which. */
TESSERA_EXPORT tessera_future_t* tessera_client_pull_async_on_stream(
    tessera_client_t* client, const tessera_pull_item_t* items, size_t count, void* cuda_stream);
TESSERA_EXPORT tessera_future_t* tessera_client_push_pull_async_on_stream(
    tessera_client_t* client, const tessera_push_pull_item_t* items, size_t count,
    void* cuda_stream);
/* The push calls before tessera_push_options_t, kept for one release: step
 * is TESSERA_NO_STEP or the worker's step. */
TESSERA_EXPORT TESSERA_DEPRECATED("use tessera_client_push_with_options") void tessera_client_push(
    tessera_client_t* client, const tessera_push_item_t* items, size_t count, uint64_t step,
    char** errptr);
TESSERA_EXPORT TESSERA_DEPRECATED("use tessera_client_push_async_with_options")
    tessera_future_t* tessera_client_push_async(tessera_client_t* client,
                                                const tessera_push_item_t* items, size_t count,
                                                uint64_t step);
TESSERA_EXPORT TESSERA_DEPRECATED("use tessera_client_push_async_with_options")
    tessera_future_t* tessera_client_push_async_on_stream(tessera_client_t* client,
                                                          const tessera_push_item_t* items,
                                                          size_t count, uint64_t step,
                                                          void* cuda_stream);

/* A tensor's optimizer state, one slot (Client::ReadOptimizerState): 0, Adam's
 * first moment, the momentum buffer or Adagrad's sum; 1, Adam's second
 * moment; 2, an f16/bf16 tensor's f32 master copy. Elements in the tensor's
 * order, f64 for an f64 tensor, else f32. Copies it into `out`, which holds
 * `capacity` bytes, and returns the bytes written (0 and an error when it
 * does not fit, naming the size); *updates (may be NULL): the optimizer
 * steps applied (Adam's t). The write (chief only) takes the whole slot. */
TESSERA_EXPORT size_t tessera_client_read_optimizer_state(tessera_client_t* client,
                                                          tessera_tensor_t tensor, int slot,
                                                          void* out, size_t capacity,
                                                          uint64_t* updates, char** errptr);
TESSERA_EXPORT void tessera_client_write_optimizer_state(tessera_client_t* client,
                                                         tessera_tensor_t tensor, int slot,
                                                         const void* data, size_t bytes,
                                                         uint64_t updates, char** errptr);

/* Chief only: a new value for one hyper-parameter from the next update on. */
TESSERA_EXPORT void tessera_client_set_hyperparam(tessera_client_t* client, tessera_tensor_t tensor,
                                                  const char* name, double value, char** errptr);
TESSERA_EXPORT uint64_t tessera_client_global_step(tessera_client_t* client, char** errptr);
/* Waits until the checkpoint is on disk; *path (may be NULL) gets its
 * directory, to release with tessera_free. Returns its global step. */
TESSERA_EXPORT uint64_t tessera_client_save_checkpoint(tessera_client_t* client, int64_t timeout_ms,
                                                       char** path, char** errptr);
TESSERA_EXPORT void tessera_client_counters(const tessera_client_t* client,
                                            tessera_counters_t* counters);

/* ---- What a declared tensor is and where it lives ---- */
TESSERA_EXPORT tessera_tensor_info_t* tessera_client_tensor_info(const tessera_client_t* client,
                                                                 tessera_tensor_t tensor,
                                                                 char** errptr);
TESSERA_EXPORT void tessera_tensor_info_destroy(tessera_tensor_info_t* info);
TESSERA_EXPORT const char* tessera_tensor_info_name(const tessera_tensor_info_t* info);
TESSERA_EXPORT int tessera_tensor_info_dtype(const tessera_tensor_info_t* info);
TESSERA_EXPORT int tessera_tensor_info_rule(const tessera_tensor_info_t* info);
TESSERA_EXPORT size_t tessera_tensor_info_ndims(const tessera_tensor_info_t* info);
TESSERA_EXPORT int64_t tessera_tensor_info_dim(const tessera_tensor_info_t* info, size_t i);
TESSERA_EXPORT uint64_t tessera_tensor_info_bytes(const tessera_tensor_info_t* info);
TESSERA_EXPORT size_t tessera_tensor_info_num_chunks(const tessera_tensor_info_t* info);
/* The ps task holding chunk i. */
TESSERA_EXPORT int tessera_tensor_info_chunk_shard(const tessera_tensor_info_t* info, size_t i);

/* ---- Futures (tessera::Future) ---- */
TESSERA_EXPORT void tessera_future_destroy(tessera_future_t* future);
TESSERA_EXPORT int tessera_future_ready(const tessera_future_t* future);
/* 1 if the call had not started and is now cancelled (it completes with
 * "Cancelled: ..."); 0 if it started or completed already. */
TESSERA_EXPORT int tessera_future_cancel(const tessera_future_t* future);
/* Waits at most the client's operation timeout. */
TESSERA_EXPORT void tessera_future_wait(const tessera_future_t* future, char** errptr);
/* 1 once complete (its error, if any, in errptr); 0 if still running after
 * timeout_ms. */
TESSERA_EXPORT int tessera_future_wait_for(const tessera_future_t* future, int64_t timeout_ms,
                                           char** errptr);
/* Waits for every future; the first error (in the array's order) is
 * reported, after all of them completed or timed out. */
TESSERA_EXPORT void tessera_future_wait_all(tessera_future_t* const* futures, size_t count,
                                            char** errptr);
/* fn(arg, error) once complete; error is NULL on success and valid only
 * during the call. It may run on the client's progress thread: it must not
 * block nor call the client. */
TESSERA_EXPORT void tessera_future_then(const tessera_future_t* future,
                                        void (*fn)(void* arg, const char* error), void* arg);
/* Chunks of this push that a sync tensor's shard dropped (stale or
 * duplicate): no error. */
TESSERA_EXPORT size_t tessera_future_num_dropped(const tessera_future_t* future);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TESSERA_C_H_ */
