// The thread pool really runs tasks concurrently on distinct threads, nests inline, and survives
// many tiny jobs back to back (the decode-step pattern).
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "test_util.h"

namespace eftest {

void test_thread_pool() {
  const int before = ef::get_num_threads();
  ef::set_num_threads(2);
  auto& pool = ef::ThreadPool::global();

  // Two tasks that each wait for the other to start: only possible if both run at once.
  auto rendezvous = [&pool](const char* when) {
    std::atomic<int> entered{0};
    std::atomic<int> met{0};
    int thread_of[2] = {-1, -1};
    pool.run(2, [&](int64_t task, int thread) {
      thread_of[task] = thread;
      entered.fetch_add(1);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (entered.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      if (entered.load() == 2) met.fetch_add(1);
    });
    expect(met.load() == 2, std::string("two pool tasks never ran at the same time ") + when);
    expect(thread_of[0] != thread_of[1], std::string("both tasks ran on the same pool thread ") + when);
  };
  rendezvous("");

  // park() (the caller is about to block on a read) puts idle workers to sleep; the next job
  // wakes them, whether they had fallen asleep yet or not.
  for (int j = 0; j < 100; ++j) {
    pool.park();
    if (j % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    rendezvous("after park()");
  }

  // A parallel_for inside a task runs inline instead of deadlocking.
  std::atomic<int64_t> inner{0};
  pool.run(4, [&](int64_t, int) { pool.run(10, [&](int64_t i, int) { inner.fetch_add(i); }); });
  expect(inner.load() == 4 * 45, "nested parallel_for lost tasks");

  // Many tiny jobs back to back: every task runs exactly once.
  std::atomic<int64_t> sum{0};
  for (int j = 0; j < 20000; ++j) pool.run(3, [&](int64_t i, int) { sum.fetch_add(i + 1); });
  expect(sum.load() == 20000 * 6, "tiny jobs lost or repeated tasks");
  ef::set_num_threads(before);
}

}  // namespace eftest
