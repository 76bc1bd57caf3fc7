#include "edgeflash/thread_pool.h"

#include <pthread.h>

#include <chrono>
#include <new>

#include "edgeflash/formats.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
static inline void cpu_relax() { _mm_pause(); }
#elif defined(__aarch64__)
static inline void cpu_relax() { asm volatile("yield" ::: "memory"); }
#else
static inline void cpu_relax() {}
#endif

namespace ef {

namespace {
thread_local bool t_inside_pool = false;
// How long an idle worker polls for the next job before sleeping: long enough to cover the gap
// between two kernels of one decode step, short enough not to steal a core from other work.
constexpr auto kSpinTime = std::chrono::microseconds(200);
}  // namespace

ThreadPool& ThreadPool::global() {
  static ThreadPool* pool = [] {
    auto* p = new ThreadPool();  // never destroyed: workers may outlive statics
    pthread_atfork(nullptr, nullptr, [] { ThreadPool::global().reset_after_fork(); });
    return p;
  }();
  return *pool;
}

// A forked child has only the forking thread: forget the parent's workers (their std::thread
// objects are leaked on purpose, joining or destroying them would abort) and run single-threaded
// until set_num_threads starts new ones.
void ThreadPool::reset_after_fork() {
  new (&workers_) std::vector<std::thread>();  // the old vector's buffer is leaked, not destroyed
  new (&run_mutex_) std::mutex();
  new (&sleep_mutex_) std::mutex();
  new (&wake_) std::condition_variable();
  n_threads_ = 1;
  active_.store(0);
  sleepers_.store(0);
  stop_.store(false);
  if (generation_.load() & 1) generation_.fetch_add(1);
}

ThreadPool::ThreadPool() {
  unsigned hw = std::thread::hardware_concurrency();
  set_num_threads(hw == 0 ? 1 : static_cast<int>(hw));
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::set_num_threads(int n) {
  if (n < 1 || n > 1024) throw KernelError("threads must be between 1 and 1024, got " + std::to_string(n));
  if (t_inside_pool) throw KernelError("set_num_threads cannot be called from inside a kernel task");
  std::lock_guard<std::mutex> lock(run_mutex_);
  if (n == n_threads_ && static_cast<int>(workers_.size()) == n - 1) return;
  stop_workers();
  n_threads_ = n;
  start_workers(n - 1);
}

void ThreadPool::start_workers(int n_workers) {
  stop_ = false;
  // The generation is read here, not in the new thread: a job published before the thread first
  // runs must still count as new for it.
  const uint64_t seen = generation_.load();
  for (int i = 0; i < n_workers; ++i) workers_.emplace_back([this, i, seen] { worker_loop(i + 1, seen); });
}

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    stop_ = true;
    generation_.fetch_add(2);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
  stop_ = false;
}

void ThreadPool::run_tasks(int thread_index) {
  const int64_t n = n_tasks_;
  for (;;) {
    const int64_t i = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n) break;
    (*fn_)(i, thread_index);
    done_tasks_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::worker_loop(int thread_index, uint64_t seen) {
  t_inside_pool = true;
  for (;;) {
    // Wait for a published generation different from the last one handled.
    uint64_t g = generation_.load(std::memory_order_acquire);
    const auto spin_start = std::chrono::steady_clock::now();
    int polls = 0;
    while (g == seen || (g & 1)) {
      cpu_relax();
      if (polls > 4096 && polls % 64 == 0) std::this_thread::yield();  // let an oversubscribed core breathe
      const bool parked = park_.load(std::memory_order_relaxed);
      if (parked || (++polls % 256 == 0 && std::chrono::steady_clock::now() - spin_start > kSpinTime)) {
        std::unique_lock<std::mutex> lock(sleep_mutex_);
        sleepers_.fetch_add(1);
        wake_.wait(lock, [&] {
          const uint64_t cur = generation_.load();
          return stop_ || (cur != seen && !(cur & 1));
        });
        sleepers_.fetch_sub(1);
      }
      if (stop_) return;
      g = generation_.load(std::memory_order_acquire);
    }
    if (stop_) return;
    // Announce, then confirm the job is still the one published (seqlock-style handshake).
    active_.fetch_add(1);
    if (generation_.load() == g) run_tasks(thread_index);
    active_.fetch_sub(1);
    seen = g;
  }
}

void ThreadPool::parallel_for(int64_t n_tasks, TaskRef fn) {
  if (n_tasks <= 0) return;
  if (n_tasks == 1 || n_threads_ == 1 || t_inside_pool) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i, 0);
    return;
  }
  std::lock_guard<std::mutex> lock(run_mutex_);
  // Odd generation: no worker may join while the job is rewritten; wait out late joiners.
  generation_.fetch_add(1);
  while (active_.load() != 0) cpu_relax();
  fn_ = &fn;
  n_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  done_tasks_.store(0, std::memory_order_relaxed);
  park_.store(false, std::memory_order_relaxed);
  generation_.fetch_add(1);  // even: published
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> sl(sleep_mutex_);
    wake_.notify_all();
  }
  t_inside_pool = true;
  run_tasks(0);
  t_inside_pool = false;
  // A worker may have been descheduled mid-task (more runnable threads than cores): after a
  // short spin, yield so it can finish instead of burning the time slice it needs.
  for (int polls = 0; done_tasks_.load(std::memory_order_acquire) < n_tasks; ++polls) {
    if (polls < 2048) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
}

void set_num_threads(int n) { ThreadPool::global().set_num_threads(n); }
int get_num_threads() { return ThreadPool::global().num_threads(); }

}  // namespace ef
