/* Every call of the C API (include/tessera/c.h), from C, against a real
 * cluster: run by c_api_test.sh as each worker of
 *   tessera launch --ps 2 --workers 2 --checkpoint-dir DIR -- c_api_test
 * It exits non-zero, naming the line, at the first check that fails.
 *
 * The workers meet through the sync tensor "sync_add": pushing step t and
 * pulling after step t is a barrier, and its value (exact sums of small
 * integers) says that both pushes arrived. */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "tessera/c.h"

#define SYNC_ELEMS 3000  /* 12000 bytes: 3 chunks of 4096 over 2 shards */
#define SGD_ELEMS 2048   /* 8 KiB */
#define CHUNK_BYTES 4096 /* small, so that a tensor spans both shards */

static int g_rank = -1;

static void fail(int line, const char* what, const char* detail) {
  fprintf(stderr, "c_api_test (worker %d): line %d: %s%s%s\n", g_rank, line, what,
          detail ? ": " : "", detail ? detail : "");
  exit(1);
}

#define CHECK(cond)                           \
  do {                                        \
    if (!(cond)) fail(__LINE__, #cond, NULL); \
  } while (0)

/* Runs the statement with a fresh `err` in scope; it must leave it NULL. */
#define OK(...)                                               \
  do {                                                        \
    char* err = NULL;                                         \
    __VA_ARGS__;                                              \
    if (err != NULL) fail(__LINE__, "unexpected error", err); \
  } while (0)

/* The statement must fail with a message containing `needle`. */
#define FAILS(needle, ...)                                                            \
  do {                                                                                \
    char* err = NULL;                                                                 \
    __VA_ARGS__;                                                                      \
    if (err == NULL) fail(__LINE__, "no error from", #__VA_ARGS__);                   \
    if (strstr(err, needle) == NULL) fail(__LINE__, "expected '" needle "' in", err); \
    tessera_free(err);                                                                \
  } while (0)

static void fill(float* v, size_t n, float x) {
  for (size_t i = 0; i < n; ++i) v[i] = x;
}

static int all_equal(const float* v, size_t n, float x) {
  for (size_t i = 0; i < n; ++i) {
    if (v[i] != x) {
      fprintf(stderr, "element %zu is %g, expected %g\n", i, (double)v[i], (double)x);
      return 0;
    }
  }
  return 1;
}

/* ---- State shared with the callbacks of tessera_future_then ---- */
static atomic_int g_then_ok;
static atomic_int g_then_failed;
static char g_then_error[256];

static void on_done(void* arg, const char* error) {
  CHECK(arg == &g_then_ok);
  if (error == NULL) {
    atomic_fetch_add(&g_then_ok, 1);
  } else {
    snprintf(g_then_error, sizeof g_then_error, "%s", error);
    atomic_fetch_add(&g_then_failed, 1);
  }
}

/* Both workers push step `step` of sync_add (value: this worker's rank + 1)
 * and pull after it: a barrier. Returns the pulled value of element 0. */
static float barrier(tessera_client_t* c, tessera_tensor_t t, uint64_t step, float* grad,
                     float* weights) {
  fill(grad, SYNC_ELEMS, (float)(g_rank + 1));
  tessera_push_item_t push = {t, grad, SYNC_ELEMS * sizeof(float)};
  tessera_pull_item_t pull = {t, weights, SYNC_ELEMS * sizeof(float), 1, step + 1};
  OK(tessera_client_push_with_options(
      c, &push, 1, &(tessera_push_options_t){.has_step = 1, .step = step}, &err));
  OK(tessera_client_pull(c, &pull, 1, &err));
  return weights[0];
}

/* The non-chief tells the chief, through a file in C_API_SIGNAL_DIR, that
 * its control queue holds a wait for init: the chief initialises only then,
 * so the wait is still pending while the call queued behind it is
 * cancelled. */
static void signal_path(char* out, size_t n) {
  const char* dir = getenv("C_API_SIGNAL_DIR");
  CHECK(dir != NULL);
  snprintf(out, n, "%s/queued", dir);
}

static void wait_for_signal(void) {
  char path[4096];
  signal_path(path, sizeof path);
  struct stat st;
  const struct timespec tick = {0, 1000000}; /* between looks; bounded below */
  for (int i = 0; i < 120000 && stat(path, &st) != 0; ++i) nanosleep(&tick, NULL);
  CHECK(stat(path, &st) == 0);
}

static void test_queued_control_calls(tessera_client_t* c) {
  tessera_future_t* waiting = tessera_client_wait_for_init_async(c, 120000);
  int64_t shape[] = {4};
  tessera_tensor_spec_t* s =
      tessera_tensor_spec_create("late", TESSERA_F32, shape, 1, TESSERA_RULE_ADD);
  tessera_tensor_t late = TESSERA_INVALID_TENSOR;
  tessera_future_t* queued = tessera_client_declare_async(c, s, &late);
  tessera_tensor_spec_destroy(s); /* the call has its own copy */
  CHECK(tessera_future_cancel(queued) == 1);
  FAILS("Cancelled", tessera_future_wait(queued, &err));
  CHECK(tessera_future_cancel(queued) == 0);
  CHECK(late == TESSERA_INVALID_TENSOR);
  CHECK(tessera_future_ready(waiting) == 0);
  char path[4096];
  signal_path(path, sizeof path);
  FILE* f = fopen(path, "w");
  CHECK(f != NULL && fclose(f) == 0);
  OK(tessera_future_wait(waiting, &err));
  CHECK(tessera_future_cancel(waiting) == 0);
  tessera_future_destroy(waiting);
  tessera_future_destroy(queued);
  FAILS("'late'", CHECK(tessera_client_find(c, "late", &err) == TESSERA_INVALID_TENSOR));
  /* An asynchronous declare hands its handle over, and its error. */
  int64_t sgd_shape[] = {SGD_ELEMS};
  s = tessera_tensor_spec_create("sgd", TESSERA_F32, sgd_shape, 1, TESSERA_RULE_SGD);
  tessera_tensor_t again = TESSERA_INVALID_TENSOR;
  tessera_future_t* d = tessera_client_declare_async(c, s, &again);
  OK(tessera_future_wait(d, &err));
  tessera_tensor_t found;
  OK(found = tessera_client_find(c, "sgd", &err));
  CHECK(again == found);
  tessera_future_destroy(d);
  tessera_tensor_spec_destroy(s);
  d = tessera_client_declare_async(c, NULL, NULL);
  FAILS("name", tessera_future_wait(d, &err));
  tessera_future_destroy(d);
}

/* An evaluator: a read-only client that looks sync_add up and pulls it. */
static void test_reader(int argc, char** argv, float expect) {
  tessera_options_t* o;
  OK(o = tessera_options_from_env(argc, (const char* const*)argv, &err));
  tessera_options_set_task(o, "evaluator", g_rank);
  tessera_options_set_read_only(o, 1);
  tessera_client_t* r;
  OK(r = tessera_client_connect(o, &err));
  CHECK(tessera_client_read_only(r) == 1 && tessera_client_is_chief(r) == 0);
  int64_t shape[] = {SYNC_ELEMS};
  tessera_tensor_spec_t* s =
      tessera_tensor_spec_create("sync_add", TESSERA_F32, shape, 1, TESSERA_RULE_ASSIGN);
  tessera_tensor_t t;
  OK(t = tessera_client_declare(r, s, &err));
  tessera_tensor_spec_destroy(s);
  static float got[SYNC_ELEMS];
  tessera_pull_item_t pull = {t, got, sizeof got, 1, 0};
  OK(tessera_client_pull(r, &pull, 1, &err));
  CHECK(all_equal(got, SYNC_ELEMS, expect));
  tessera_push_item_t push = {t, got, sizeof got};
  FAILS("read-only", tessera_client_push_with_options(
                         r, &push, 1, &(tessera_push_options_t){.has_step = 1, .step = 7}, &err));
  FAILS("read-only", tessera_client_initialize(r, &err));
  tessera_client_destroy(r);
  tessera_options_destroy(o);
}

static void test_options_errors(void) {
  tessera_options_t* o = tessera_options_create();
  CHECK(o != NULL);
  FAILS("JSON", tessera_options_set_cluster_json(o, "{\"ps\": [", &err));
  FAILS("json is NULL", tessera_options_set_cluster_json(o, NULL, &err));
  FAILS("options is NULL", tessera_options_set_cluster_json(NULL, "{}", &err));
  /* No cluster: Connect says so instead of waiting. */
  FAILS("ps", CHECK(tessera_client_connect(o, &err) == NULL));
  FAILS("options is NULL", CHECK(tessera_client_connect(NULL, &err) == NULL));
  OK(tessera_options_set_cluster_json(
      o, "{\"ps\": [\"127.0.0.1:1\"], \"worker\": [\"127.0.0.1:2\"]}", &err));
  CHECK(tessera_options_num_workers(o) == 1);
  tessera_options_set_task(o, "ps", 0);
  FAILS("ps", CHECK(tessera_options_worker_rank(o, &err) == -1));
  tessera_options_set_task(o, "worker", 0);
  OK(CHECK(tessera_options_worker_rank(o, &err) == 0));
  /* A wrong transport is named by Connect. */
  tessera_options_set_transport(o, "carrier-pigeon");
  tessera_options_set_secret(o, "0123456789abcdef0123456789abcdef", 32);
  FAILS("carrier-pigeon", CHECK(tessera_client_connect(o, &err) == NULL));
  /* A retry bound past the operation timeout is refused, naming both. */
  tessera_options_set_transport(o, "tcp");
  tessera_options_set_op_timeout_ms(o, 1000);
  tessera_options_set_retry_lost_shard_ms(o, 5000);
  FAILS("retry_lost_shard_within (5000 ms) exceeds op_timeout (1000 ms)",
        CHECK(tessera_client_connect(o, &err) == NULL));
  tessera_options_destroy(o);

  /* FromEnv names the variable or flag that is wrong. */
  const char* saved = getenv("TESSERA_TRANSPORT");
  char* saved_copy = saved ? strdup(saved) : NULL;
  setenv("TESSERA_TRANSPORT", "carrier-pigeon", 1);
  FAILS("TESSERA_TRANSPORT", CHECK(tessera_options_from_env(0, NULL, &err) == NULL));
  if (saved_copy) {
    setenv("TESSERA_TRANSPORT", saved_copy, 1);
    free(saved_copy);
  } else {
    unsetenv("TESSERA_TRANSPORT");
  }
  const char* partial[] = {"trainer", "--job_name=worker", "--task_index", "0"};
  FAILS("--ps_hosts", CHECK(tessera_options_from_env(4, partial, &err) == NULL));
  const char* dangling[] = {"trainer", "--task_index"};
  FAILS("--task_index has no value", CHECK(tessera_options_from_env(2, dangling, &err) == NULL));
  /* TF1 flags take the place of TF_CONFIG; other arguments are the trainer's. */
  const char* flags[] = {"trainer",
                         "--epochs=3",
                         "--ps_hosts",
                         "127.0.0.1:1",
                         "--worker_hosts=127.0.0.1:2,127.0.0.1:3",
                         "--job_name=worker",
                         "--task_index=1"};
  OK(o = tessera_options_from_env(7, flags, &err));
  CHECK(tessera_options_num_workers(o) == 2);
  OK(CHECK(tessera_options_worker_rank(o, &err) == 1));
  tessera_options_destroy(o);
}

static void test_spec_errors(tessera_client_t* c) {
  int64_t shape[] = {4};
  tessera_tensor_spec_t* s =
      tessera_tensor_spec_create("bad", TESSERA_F32, shape, 1, TESSERA_RULE_SGD);
  FAILS("unknown hyper-parameter 'bogus'", tessera_tensor_spec_set_hyperparam(s, "bogus", 1, &err));
  FAILS("learning_rate", tessera_tensor_spec_set_hyperparam(s, "learning_rate", -1, &err));
  FAILS("spec is NULL", tessera_tensor_spec_set_hyperparam(NULL, "momentum", 0.9, &err));
  FAILS("spec is NULL", CHECK(tessera_client_declare(c, NULL, &err) == TESSERA_INVALID_TENSOR));
  tessera_tensor_spec_destroy(s);

  s = tessera_tensor_spec_create("bad_dtype", 99, shape, 1, TESSERA_RULE_ADD);
  FAILS("bad_dtype", CHECK(tessera_client_declare(c, s, &err) == TESSERA_INVALID_TENSOR));
  tessera_tensor_spec_destroy(s);

  s = tessera_tensor_spec_create("bad_init", TESSERA_F32, shape, 1, TESSERA_RULE_ADD);
  tessera_tensor_spec_set_initializer(s, 256 + TESSERA_INIT_CONSTANT, 1, 0, 0);
  FAILS("unknown initializer kind",
        CHECK(tessera_client_declare(c, s, &err) == TESSERA_INVALID_TENSOR));
  tessera_tensor_spec_destroy(s);

  s = tessera_tensor_spec_create("bad_pin", TESSERA_F32, shape, 1, TESSERA_RULE_ADD);
  tessera_tensor_spec_pin_shard(s, 7);
  FAILS("bad_pin", CHECK(tessera_client_declare(c, s, &err) == TESSERA_INVALID_TENSOR));
  tessera_tensor_spec_destroy(s);

  /* The same name again with another shape. */
  int64_t other[] = {5};
  s = tessera_tensor_spec_create("sync_add", TESSERA_F32, other, 1, TESSERA_RULE_ADD);
  FAILS("sync_add", CHECK(tessera_client_declare(c, s, &err) == TESSERA_INVALID_TENSOR));
  tessera_tensor_spec_destroy(s);

  FAILS("'nope'", CHECK(tessera_client_find(c, "nope", &err) == TESSERA_INVALID_TENSOR));
  FAILS("name is NULL", CHECK(tessera_client_find(c, NULL, &err) == TESSERA_INVALID_TENSOR));
  FAILS("9999", CHECK(tessera_client_tensor_info(c, 9999, &err) == NULL));
}

static void test_info(tessera_client_t* c, tessera_tensor_t t) {
  tessera_tensor_info_t* info;
  OK(info = tessera_client_tensor_info(c, t, &err));
  CHECK(strcmp(tessera_tensor_info_name(info), "sync_add") == 0);
  CHECK(tessera_tensor_info_dtype(info) == TESSERA_F32);
  CHECK(tessera_tensor_info_rule(info) == TESSERA_RULE_ADD);
  CHECK(tessera_tensor_info_ndims(info) == 1);
  CHECK(tessera_tensor_info_dim(info, 0) == SYNC_ELEMS);
  CHECK(tessera_tensor_info_dim(info, 1) == -1);
  CHECK(tessera_tensor_info_bytes(info) == SYNC_ELEMS * sizeof(float));
  const size_t chunks = tessera_tensor_info_num_chunks(info);
  CHECK(chunks == (SYNC_ELEMS * sizeof(float) + CHUNK_BYTES - 1) / CHUNK_BYTES);
  int on_shard[2] = {0, 0};
  for (size_t i = 0; i < chunks; ++i) {
    const int shard = tessera_tensor_info_chunk_shard(info, i);
    CHECK(shard == 0 || shard == 1);
    on_shard[shard]++;
  }
  CHECK(on_shard[0] > 0 && on_shard[1] > 0);
  CHECK(tessera_tensor_info_chunk_shard(info, chunks) == -1);
  tessera_tensor_info_destroy(info);
}

static void test_call_errors(tessera_client_t* c, tessera_tensor_t sync_add, tessera_tensor_t sgd) {
  float small[4] = {0};
  tessera_push_item_t wrong_size = {sgd, small, sizeof small};
  FAILS("bytes", tessera_client_push_with_options(c, &wrong_size, 1, NULL, &err));
  tessera_pull_item_t unknown = {4242, small, sizeof small, 1, 0};
  FAILS("4242", tessera_client_pull(c, &unknown, 1, &err));
  /* A sync tensor needs its step; push_pull refuses it. */
  static float grad[SYNC_ELEMS], weights[SYNC_ELEMS];
  tessera_push_item_t no_step = {sync_add, grad, sizeof grad};
  FAILS("sync_add", tessera_client_push_with_options(c, &no_step, 1, NULL, &err));
  tessera_push_pull_item_t pp = {sync_add, grad, weights, sizeof grad};
  FAILS("sync_add", tessera_client_push_pull(c, &pp, 1, &err));

  /* NULL where memory must be is refused by name (a push with data=NULL
     used to crash the process). */
  tessera_push_item_t null_data = {sgd, NULL, SGD_ELEMS * sizeof(float)};
  FAILS("null data pointer", tessera_client_push_with_options(c, &null_data, 1, NULL, &err));
  tessera_pull_item_t null_pull = {sgd, NULL, SGD_ELEMS * sizeof(float), 1, 0};
  FAILS("null data pointer", tessera_client_pull(c, &null_pull, 1, &err));
  tessera_push_pull_item_t null_weights = {sgd, grad, NULL, SGD_ELEMS * sizeof(float)};
  FAILS("null weights pointer", tessera_client_push_pull(c, &null_weights, 1, &err));
  FAILS("items", tessera_client_push_with_options(c, NULL, 1, NULL, &err));
  /* Push options left uninitialised, or a step said to be there and to be
     none, are refused by name, never read as some step. */
  tessera_push_options_t garbage = {.has_step = 2, .step = 0};
  FAILS("has_step is 2", tessera_client_push_with_options(c, &no_step, 1, &garbage, &err));
  tessera_push_options_t none_step = {.has_step = 1, .step = TESSERA_NO_STEP};
  FAILS("TESSERA_NO_STEP", tessera_client_push_with_options(c, &no_step, 1, &none_step, &err));
  tessera_future_t* garbled = tessera_client_push_async_with_options(c, &no_step, 1, &garbage);
  FAILS("has_step is 2", tessera_future_wait(garbled, &err));
  tessera_future_destroy(garbled);
  FAILS("client is NULL", tessera_client_pull(NULL, &null_pull, 1, &err));
  tessera_future_t* refused = tessera_client_pull_async(c, NULL, 2);
  CHECK(refused != NULL && tessera_future_ready(refused) == 1);
  FAILS("items", tessera_future_wait(refused, &err));
  tessera_future_destroy(refused);

  /* An asynchronous call's error: through wait, wait_for and then. */
  tessera_future_t* f = tessera_client_push_async_with_options(c, &wrong_size, 1, NULL);
  CHECK(f != NULL);
  FAILS("bytes", tessera_future_wait(f, &err));
  CHECK(tessera_future_ready(f) == 1);
  FAILS("bytes", CHECK(tessera_future_wait_for(f, 0, &err) == 1));
  tessera_future_then(f, on_done, &g_then_ok); /* complete already: runs at once */
  CHECK(atomic_load(&g_then_failed) == 1 && strstr(g_then_error, "bytes") != NULL);
  FAILS("future is NULL", tessera_future_wait(NULL, &err));

  /* wait_all reports the first error in the array's order. */
  tessera_future_t* both[2];
  tessera_pull_item_t ok_pull = {sgd, weights, SGD_ELEMS * sizeof(float), 1, 0};
  both[0] = tessera_client_pull_async(c, &ok_pull, 1);
  both[1] = f;
  FAILS("bytes", tessera_future_wait_all(both, 2, &err));
  CHECK(tessera_future_ready(both[0]) == 1);
  OK(tessera_future_wait(both[0], &err));
  tessera_future_destroy(both[0]);
  tessera_future_destroy(f);
}

int main(int argc, char** argv) {
  CHECK(strcmp(tessera_version(), TESSERA_EXPECTED_VERSION) == 0);
  test_options_errors();

  tessera_options_t* o;
  OK(o = tessera_options_from_env(argc, (const char* const*)argv, &err));
  OK(g_rank = tessera_options_worker_rank(o, &err));
  CHECK(tessera_options_num_workers(o) == 2);
  tessera_options_set_chunk_bytes(o, CHUNK_BYTES);
  tessera_options_set_inline_bytes(o, 0); /* every byte one-sided */
  tessera_options_set_op_timeout_ms(o, 120000);
  tessera_options_set_startup_timeout_ms(o, 120000);
  tessera_options_set_heartbeat_ms(o, 1000, 30000);
  tessera_options_set_retry_lost_shard_ms(o, 60000);
  tessera_client_t* c;
  OK(c = tessera_client_connect(o, &err));
  CHECK(tessera_client_is_chief(c) == (g_rank == 0));
  CHECK(tessera_client_num_shards(c) == 2);

  /* sync_add: summed over both workers each step, from 10. */
  int64_t sync_shape[] = {SYNC_ELEMS};
  tessera_tensor_spec_t* s =
      tessera_tensor_spec_create("sync_add", TESSERA_F32, sync_shape, 1, TESSERA_RULE_ADD);
  tessera_tensor_spec_set_sync(s, 0, 0, 0);
  static float initial[SYNC_ELEMS];
  fill(initial, SYNC_ELEMS, 10.0f);
  tessera_tensor_spec_set_initial(s, initial, sizeof initial);
  tessera_tensor_t sync_add;
  OK(sync_add = tessera_client_declare(c, s, &err));
  tessera_tensor_spec_destroy(s);

  /* sgd: plain SGD from 1.0, asynchronous. */
  int64_t sgd_shape[] = {SGD_ELEMS};
  s = tessera_tensor_spec_create("sgd", TESSERA_F32, sgd_shape, 1, TESSERA_RULE_SGD);
  OK(tessera_tensor_spec_set_hyperparam(s, "learning_rate", 0.5, &err));
  tessera_tensor_spec_set_initializer(s, TESSERA_INIT_CONSTANT, 1.0, 0.0, 0);
  tessera_tensor_spec_set_async(s);
  tessera_tensor_t sgd;
  OK(sgd = tessera_client_declare(c, s, &err));
  tessera_tensor_spec_destroy(s);

  /* bounded: on ps task 1 only, staleness 1, Adam. */
  int64_t bounded_shape[] = {2, 4};
  s = tessera_tensor_spec_create("bounded", TESSERA_F32, bounded_shape, 2, TESSERA_RULE_ADAM);
  tessera_tensor_spec_set_bounded(s, 1);
  tessera_tensor_spec_pin_shard(s, 1);
  tessera_tensor_spec_set_initializer(s, TESSERA_INIT_GLOROT_UNIFORM, 0, 0, 42);
  tessera_tensor_t bounded;
  OK(bounded = tessera_client_declare(c, s, &err));
  tessera_tensor_spec_destroy(s);

  tessera_tensor_t found;
  OK(found = tessera_client_find(c, "sync_add", &err));
  CHECK(found == sync_add);
  test_info(c, sync_add);
  tessera_tensor_info_t* binfo;
  OK(binfo = tessera_client_tensor_info(c, bounded, &err));
  CHECK(tessera_tensor_info_num_chunks(binfo) == 1 &&
        tessera_tensor_info_chunk_shard(binfo, 0) == 1);
  CHECK(tessera_tensor_info_ndims(binfo) == 2 && tessera_tensor_info_dim(binfo, 1) == 4);
  tessera_tensor_info_destroy(binfo);
  test_spec_errors(c);

  CHECK(tessera_client_read_only(c) == 0);
  uint64_t start = 99;
  CHECK(tessera_client_start_step(c, &start) == 0 && start == 99); /* not initialised yet */
  if (tessera_client_is_chief(c)) {
    wait_for_signal();
    tessera_future_t* init = tessera_client_initialize_async(c);
    OK(tessera_future_wait(init, &err));
    tessera_future_destroy(init);
  } else {
    FAILS("chief", tessera_client_initialize(c, &err));
    test_queued_control_calls(c);
    OK(tessera_client_wait_for_init(c, 120000, &err));
  }
  uint64_t restored = 0;
  CHECK(tessera_client_restored_step(c, &restored) == 0);
  CHECK(tessera_client_start_step(c, &start) == 1 && start == 0); /* a fresh cluster */

  static float grad[SYNC_ELEMS], weights[SYNC_ELEMS];
  /* Step 0, blocking: 10 + 1 + 2. */
  CHECK(barrier(c, sync_add, 0, grad, weights) == 13.0f);
  CHECK(all_equal(weights, SYNC_ELEMS, 13.0f));

  /* Step 1, asynchronous: the pull after step 1 waits for both pushes. */
  fill(grad, SYNC_ELEMS, (float)(g_rank + 1));
  tessera_push_item_t push = {sync_add, grad, sizeof grad};
  tessera_pull_item_t pull = {sync_add, weights, sizeof weights, 1, 2};
  tessera_future_t* f[2];
  f[0] = tessera_client_push_async_with_options(
      c, &push, 1, &(tessera_push_options_t){.has_step = 1, .step = 1});
  f[1] = tessera_client_pull_async_on_stream(c, &pull, 1, NULL); /* no stream: as pull_async */
  tessera_future_then(f[0], on_done, &g_then_ok);
  OK(tessera_future_wait_all(f, 2, &err));
  CHECK(tessera_future_ready(f[0]) && tessera_future_ready(f[1]));
  CHECK(atomic_load(&g_then_ok) == 1);
  CHECK(tessera_future_num_dropped(f[0]) == 0);
  CHECK(all_equal(weights, SYNC_ELEMS, 16.0f));
  OK(CHECK(tessera_future_wait_for(f[1], 0, &err) == 1));
  tessera_future_destroy(f[0]);
  tessera_future_destroy(f[1]);

  /* Step 1 again: the shards drop it (stale), which is no error. */
  tessera_future_t* dup = tessera_client_push_async_with_options(
      c, &push, 1, &(tessera_push_options_t){.has_step = 1, .step = 1});
  OK(tessera_future_wait(dup, &err));
  CHECK(tessera_future_num_dropped(dup) > 0);
  tessera_future_destroy(dup);

  /* Async SGD through push_pull: each worker sees its own push applied. */
  static float sgd_grad[SGD_ELEMS], sgd_weights[SGD_ELEMS];
  fill(sgd_grad, SGD_ELEMS, 1.0f);
  tessera_push_pull_item_t pp = {sgd, sgd_grad, sgd_weights, sizeof sgd_grad};
  OK(tessera_client_push_pull(c, &pp, 1, &err));
  CHECK(sgd_weights[0] == 0.5f || sgd_weights[0] == 0.0f);
  CHECK(barrier(c, sync_add, 2, grad, weights) == 19.0f);
  /* Both push_pulls were applied: 1 - 0.5 - 0.5. Then the chief pushes at
   * a new learning rate. */
  tessera_pull_item_t sgd_pull = {sgd, sgd_weights, sizeof sgd_weights, 1, 0};
  OK(tessera_client_pull(c, &sgd_pull, 1, &err));
  CHECK(all_equal(sgd_weights, SGD_ELEMS, 0.0f));
  CHECK(barrier(c, sync_add, 3, grad, weights) == 22.0f); /* both pulled */
  if (tessera_client_is_chief(c)) {
    OK(tessera_client_set_hyperparam(c, sgd, "learning_rate", 0.25, &err));
    FAILS("bogus", tessera_client_set_hyperparam(c, sgd, "bogus", 1, &err));
    FAILS("4242", tessera_client_set_hyperparam(c, 4242, "learning_rate", 1, &err));
    tessera_push_item_t sgd_push = {sgd, sgd_grad, sizeof sgd_grad};
    OK(tessera_client_push_with_options(c, &sgd_push, 1, NULL, &err));
  } else {
    FAILS("chief", tessera_client_set_hyperparam(c, sgd, "learning_rate", 0.25, &err));
  }
  CHECK(barrier(c, sync_add, 4, grad, weights) == 25.0f);
  OK(tessera_client_pull(c, &sgd_pull, 1, &err));
  CHECK(all_equal(sgd_weights, SGD_ELEMS, -0.25f));

  /* Bounded Adam: a push at step 0 moves every weight. */
  float b_grad[8], b_before[8], b_after[8];
  fill(b_grad, 8, 1.0f);
  tessera_pull_item_t b_pull = {bounded, b_before, sizeof b_before, 1, 0};
  OK(tessera_client_pull(c, &b_pull, 1, &err));
  tessera_push_item_t b_push = {bounded, b_grad, sizeof b_grad};
  /* Through the call before tessera_push_options_t, kept for one release:
   * a wrapper of tessera_client_push_with_options. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  OK(tessera_client_push(c, &b_push, 1, 0, &err));
#pragma GCC diagnostic pop
  b_pull.data = b_after;
  b_pull.min_step = 1; /* every worker pushed step 0 */
  OK(tessera_client_pull(c, &b_pull, 1, &err));
  for (int i = 0; i < 8; ++i) CHECK(b_after[i] < b_before[i]);

  /* Its optimizer state: Adam's two moments, 8 f32 each, read whole; the
   * chief writes one back, the other worker may not. */
  float m[8], v[8];
  uint64_t updates = 0;
  OK(CHECK(tessera_client_read_optimizer_state(c, bounded, 0, m, sizeof m, &updates, &err) ==
           sizeof m));
  CHECK(updates >= 1 && m[0] > 0.0f);
  OK(CHECK(tessera_client_read_optimizer_state(c, bounded, 1, v, sizeof v, NULL, &err) ==
           sizeof v));
  FAILS("does not fit", tessera_client_read_optimizer_state(c, bounded, 1, v, 4, NULL, &err));
  FAILS("state slot 7",
        tessera_client_read_optimizer_state(c, bounded, 7, v, sizeof v, NULL, &err));
  FAILS("keeps no", tessera_client_read_optimizer_state(c, bounded, 2, v, sizeof v, NULL, &err));
  if (tessera_client_is_chief(c)) {
    OK(tessera_client_write_optimizer_state(c, bounded, 1, v, sizeof v, updates, &err));
    FAILS("bytes for a slot of 32",
          tessera_client_write_optimizer_state(c, bounded, 1, v, 4, updates, &err));
  } else {
    FAILS("chief", tessera_client_write_optimizer_state(c, bounded, 1, v, sizeof v, 0, &err));
  }

  test_call_errors(c, sync_add, sgd);

  /* Every pull above went one-sided (inline_bytes 0). */
  tessera_counters_t counters;
  tessera_client_counters(c, &counters);
  CHECK(counters.gets > 0 && counters.get_bytes >= 4 * sizeof weights);
  CHECK(counters.puts > 0 && counters.put_bytes >= 4 * sizeof grad);
  CHECK(counters.messages_sent > 0 && counters.message_bytes_received > 0);
  /* Step 1's second push: stale, as step 1 had been applied. */
  CHECK(counters.chunks_dropped_stale > 0);
  CHECK(counters.host_staged_bytes == 0 && counters.cuda_ipc_bytes == 0);

  /* Five sync steps were completed by both workers (the async pushes count
   * too, in whatever order they came). The shards report steps after they
   * answered the pulls (docs/training.md), so the count may arrive after
   * this worker's last pull: wait for it, bounded. */
  uint64_t step = 0;
  const struct timespec tick = {0, 1000000};
  for (int i = 0; i < 120000; ++i) {
    OK(step = tessera_client_global_step(c, &err));
    if (step >= 5) break;
    nanosleep(&tick, NULL);
  }
  CHECK(step >= 5);
  if (tessera_client_is_chief(c)) {
    char* path = NULL;
    uint64_t saved;
    OK(saved = tessera_client_save_checkpoint(c, 120000, &path, &err));
    CHECK(saved >= 5 && path != NULL);
    struct stat st;
    CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode));
    printf("checkpoint of step %llu in %s\n", (unsigned long long)saved, path);
    tessera_free(path);
  }
  CHECK(barrier(c, sync_add, 5, grad, weights) == 28.0f);
  test_reader(argc, argv, 28.0f);

  /* A call that cannot complete (sgd will not see a millionth update) fails
   * when its client goes, instead of waiting out the operation timeout. */
  tessera_pull_item_t never = {sgd, sgd_weights, sizeof sgd_weights, 1000000, 0};
  tessera_future_t* orphan = tessera_client_pull_async(c, &never, 1);
  OK(CHECK(tessera_future_wait_for(orphan, 10, &err) == 0));
  CHECK(tessera_future_ready(orphan) == 0);
  tessera_client_destroy(c);
  CHECK(tessera_future_ready(orphan) == 1);
  FAILS("destroyed", tessera_future_wait(orphan, &err));
  tessera_future_destroy(orphan);

  /* The destroyed client's handles name nothing on the next client, even
   * where the next one holds another tensor at the same index (sgd at 0,
   * where sync_add was). */
  tessera_client_t* next;
  OK(next = tessera_client_connect(o, &err));
  s = tessera_tensor_spec_create("sgd", TESSERA_F32, sgd_shape, 1, TESSERA_RULE_SGD);
  OK(tessera_tensor_spec_set_hyperparam(s, "learning_rate", 0.5, &err));
  tessera_tensor_spec_set_initializer(s, TESSERA_INIT_CONSTANT, 1.0, 0.0, 0);
  tessera_tensor_t sgd_again;
  OK(sgd_again = tessera_client_declare(next, s, &err));
  tessera_tensor_spec_destroy(s);
  CHECK(sgd_again != sync_add && sgd_again != sgd);
  tessera_pull_item_t stale = {sync_add, sgd_weights, sizeof sgd_weights, 1, 0};
  FAILS("another client", tessera_client_pull(next, &stale, 1, &err));
  FAILS("another client", CHECK(tessera_client_tensor_info(next, sgd, &err) == NULL));
  tessera_pull_item_t fresh = {sgd_again, sgd_weights, sizeof sgd_weights, 1, 0};
  OK(tessera_client_pull(next, &fresh, 1, &err));
  CHECK(all_equal(sgd_weights, SGD_ELEMS, -0.25f));
  tessera_client_destroy(next);
  tessera_options_destroy(o);
  printf("c_api_test: worker %d passed\n", g_rank);
  return 0;
}
