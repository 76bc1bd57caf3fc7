// One persistent thread pool shared by every kernel. The calling thread works too, so
// `threads = n` means n - 1 workers. Idle workers spin briefly (a decode step issues many small
// kernels back to back) and then sleep on a condition variable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace ef {

// A non-owning reference to a callable `void(int64_t task, int thread)`; no allocation.
class TaskRef {
 public:
  template <class F>
  TaskRef(F& f) : obj_(&f), call_([](void* o, int64_t t, int th) { (*static_cast<F*>(o))(t, th); }) {}
  void operator()(int64_t task, int thread) const { call_(obj_, task, thread); }

 private:
  void* obj_;
  void (*call_)(void*, int64_t, int);
};

class ThreadPool {
 public:
  static ThreadPool& global();
  ~ThreadPool();

  // n >= 1; takes effect for the next parallel_for. Not to be called from inside a task.
  void set_num_threads(int n);
  int num_threads() const { return n_threads_; }

  // Runs fn(task, thread) for every task in [0, n_tasks); thread is in [0, num_threads()).
  // Tasks are claimed dynamically. Calls from inside a task, or with one thread, run inline.
  void parallel_for(int64_t n_tasks, TaskRef fn);
  template <class F>
  void run(int64_t n_tasks, F&& f) {
    parallel_for(n_tasks, TaskRef(f));
  }

  // The caller is about to block (on a read from flash, say) and runs no job until it returns:
  // idle workers sleep now instead of spinning for the next job, leaving the cores to the
  // threads that will end the wait. The next parallel_for wakes them.
  void park() { park_.store(true, std::memory_order_relaxed); }

 private:
  ThreadPool();
  void start_workers(int n_workers);
  void stop_workers();
  void worker_loop(int thread_index, uint64_t seen);
  void run_tasks(int thread_index);
  void reset_after_fork();

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one parallel_for at a time from outside the pool

  // The current job. `generation_` is even when a job is published, odd while one is written;
  // workers join a job only after announcing themselves in `active_` (see thread_pool.cpp).
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> active_{0};
  std::atomic<int64_t> next_task_{0};
  std::atomic<int64_t> done_tasks_{0};
  int64_t n_tasks_ = 0;
  TaskRef* fn_ = nullptr;
  std::atomic<bool> stop_{false};
  std::atomic<bool> park_{false};  // set by park(), cleared when the next job is published

  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
};

// Convenience wrappers over the global pool.
void set_num_threads(int n);
int get_num_threads();

}  // namespace ef
