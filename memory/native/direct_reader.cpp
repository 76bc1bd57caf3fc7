#include "direct_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace ef::memory {
namespace {

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
}

}  // namespace

std::vector<size_t> split_request(size_t n, size_t chunk_bytes) {
  std::vector<size_t> pieces;
  if (n == 0) return pieces;
  const size_t count = (n + chunk_bytes - 1) / chunk_bytes;
  const size_t pages = (n + kIoAlignment - 1) / kIoAlignment;
  size_t at = 0;
  for (size_t i = 0; i < count && at < n; ++i) {  // the first pages % count pieces get one page more
    const size_t len = (pages / count + (i < pages % count ? 1 : 0)) * kIoAlignment;
    pieces.push_back(std::min(len, n - at));
    at += pieces.back();
  }
  return pieces;
}

AlignedBuffer::AlignedBuffer(size_t bytes) : size_(align_up(bytes)) {
  if (size_ == 0) return;
  if (size_ >= kHugePage) {
    // Map a huge page more than needed, keep the part that starts on a huge-page boundary.
    const size_t span = size_ + kHugePage;
    void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    const uintptr_t start = (at + kHugePage - 1) / kHugePage * kHugePage;
    if (start > at) ::munmap(p, start - at);
    if (at + span > start + size_) ::munmap(reinterpret_cast<void*>(start + size_), at + span - (start + size_));
    // Advice only: where transparent huge pages are off the buffer keeps 4 KiB pages, still correct.
    ::madvise(reinterpret_cast<void*>(start), size_, MADV_HUGEPAGE);
    data_ = reinterpret_cast<uint8_t*>(start);
    mapped_ = true;
    return;
  }
  void* p = nullptr;
  if (posix_memalign(&p, kIoAlignment, size_) != 0) throw std::bad_alloc();
  data_ = static_cast<uint8_t*>(p);
}

AlignedBuffer::~AlignedBuffer() { release(); }

void AlignedBuffer::release() {
  if (mapped_) ::munmap(data_, size_);
  else std::free(data_);
  data_ = nullptr;
  size_ = 0;
  mapped_ = false;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(other.data_), size_(other.size_), mapped_(other.mapped_) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.mapped_ = false;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    mapped_ = other.mapped_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.mapped_ = false;
  }
  return *this;
}

DirectReader::DirectReader(const std::string& path, bool direct, int threads, size_t chunk_bytes)
    : path_(path), direct_(direct), chunk_bytes_(chunk_bytes) {
  if (threads < 1) throw std::invalid_argument("direct reader: threads must be >= 1");
  if (chunk_bytes_ == 0 || chunk_bytes_ % kIoAlignment)
    throw std::invalid_argument("direct reader: chunk size must be a positive multiple of 4096");
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd_ < 0) throw std::runtime_error(path + ": cannot open for reading (" + std::strerror(errno) + ")");
  struct stat st{};
  if (::fstat(fd_, &st) != 0) throw std::runtime_error(path + ": cannot stat (" + std::strerror(errno) + ")");
  size_at_open_ = st.st_size;
  mtime_ns_at_open_ = mtime_ns(st);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { worker(); });
}

DirectReader::~DirectReader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  if (fd_ >= 0) ::close(fd_);
}

void DirectReader::read_fully(int64_t offset, size_t n, uint8_t* dst, std::string* error) const {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, dst + done, n - done, offset + static_cast<int64_t>(done));
    if (got < 0) {
      if (errno == EINTR) continue;
      *error = path_ + ": read error at byte " + std::to_string(offset + done) + " (" + std::strerror(errno) + ")";
      return;
    }
    if (got == 0 && offset + static_cast<int64_t>(done) >= size_at_open_) {
      std::memset(dst + done, 0, n - done);  // an aligned read past the end of the file: padding
      return;
    }
    if (got == 0) {
      *error = path_ + ": the file ends at byte " + std::to_string(offset + done) + " but " +
               std::to_string(offset + n) + " were expected (truncated while loaded?)";
      return;
    }
    done += static_cast<size_t>(got);
  }
}

uint64_t DirectReader::submit(int64_t offset, size_t n, uint8_t* dst) {
  if (direct_ && (offset % kIoAlignment || n % kIoAlignment || reinterpret_cast<uintptr_t>(dst) % kIoAlignment))
    throw std::invalid_argument("direct reader: offset, size and destination must be 4096-aligned");
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t ticket = next_ticket_++;
  Ticket t;
  size_t at = 0;
  for (const size_t len : split_request(n, chunk_bytes_)) {
    queue_.push_back(Piece{ticket, offset + static_cast<int64_t>(at), len, dst + at});
    at += len;
    ++t.remaining;
  }
  const int pieces = t.remaining;
  tickets_.emplace_back(ticket, std::move(t));
  requests_.fetch_add(1, std::memory_order_relaxed);
  // One idle thread per piece: waking every thread for each request costs each of them a core
  // switch, and on a board with few cores those switches take time from compute.
  for (int i = 0; i < pieces; ++i) work_cv_.notify_one();
  return ticket;
}

void DirectReader::wait(uint64_t ticket, void (*before_blocking)()) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  auto find = [&] {
    for (auto it = tickets_.begin(); it != tickets_.end(); ++it)
      if (it->first == ticket) return it;
    return tickets_.end();
  };
  auto it = find();
  if (it == tickets_.end()) throw std::invalid_argument("direct reader: unknown ticket");
  if (it->second.remaining > 0 && before_blocking) before_blocking();
  done_cv_.wait(lock, [&] { it = find(); return it->second.remaining == 0; });
  const std::string error = it->second.error;
  tickets_.erase(it);
  lock.unlock();
  wait_ns_.fetch_add(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()));
  if (!error.empty()) throw std::runtime_error(error);
}

void DirectReader::read_now(int64_t offset, size_t n, uint8_t* dst) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  read_fully(offset, n, dst, &error);
  bytes_read_.fetch_add(n, std::memory_order_relaxed);
  requests_.fetch_add(1, std::memory_order_relaxed);
  wait_ns_.fetch_add(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()));
  if (!error.empty()) throw std::runtime_error(error);
}

void DirectReader::worker() {
  for (;;) {
    Piece p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty()) return;
      p = queue_.front();
      queue_.pop_front();
    }
    std::string error;
    read_fully(p.offset, p.n, p.dst, &error);
    bytes_read_.fetch_add(p.n, std::memory_order_relaxed);
    bool finished = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, t] : tickets_) {
        if (id != p.ticket) continue;
        if (!error.empty() && t.error.empty()) t.error = error;
        finished = --t.remaining == 0;
      }
    }
    if (finished) done_cv_.notify_all();  // the waiter only cares about whole requests
  }
}

void DirectReader::check_unchanged() const {
  struct stat st{};
  if (::fstat(fd_, &st) != 0) throw std::runtime_error(path_ + ": cannot stat (" + std::strerror(errno) + ")");
  if (st.st_size != size_at_open_)
    throw std::runtime_error(path_ + ": the file changed size while loaded (" + std::to_string(size_at_open_) +
                             " -> " + std::to_string(st.st_size) + " bytes)");
  if (mtime_ns(st) != mtime_ns_at_open_)
    throw std::runtime_error(path_ + ": the file was modified while loaded");
}

ReaderStats DirectReader::stats() const {
  return ReaderStats{bytes_read_.load(), requests_.load(), wait_ns_.load()};
}

}  // namespace ef::memory
