// Positioned reads from one file with direct I/O (O_DIRECT: the page cache never holds the
// model, so the memory budget stays honest) on a few I/O threads, so several reads are in
// flight and reading overlaps compute. Requests are split into equal pieces; each request gets a
// ticket to wait on. Destinations and offsets must be 4 KiB aligned (bundle blocks are).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ef::memory {

constexpr size_t kIoAlignment = 4096;

struct ReaderStats {
  uint64_t bytes_read = 0;
  uint64_t requests = 0;
  uint64_t wait_ns = 0;  // time callers spent blocked in wait()
};

// The byte counts a request of n bytes is read in: as few pieces as chunk_bytes allows, all the
// same size (4 KiB multiples, the last one takes the rest). Equal pieces keep every I/O thread busy
// to the end of a request: split as one full chunk and a remainder, a unit of 1.33 chunks (Gemma 3's
// 1.47 MB head chunks against 1.1 MB reads) has one thread idle for most of it.
std::vector<size_t> split_request(size_t n, size_t chunk_bytes);

class DirectReader {
 public:
  // direct = false reads through the page cache (for file systems without O_DIRECT, e.g. tmpfs;
  // the caller decides and reports it). threads >= 1; chunk_bytes a multiple of 4096.
  DirectReader(const std::string& path, bool direct, int threads, size_t chunk_bytes);
  ~DirectReader();
  DirectReader(const DirectReader&) = delete;
  DirectReader& operator=(const DirectReader&) = delete;

  // Queue a read of [offset, offset + n) into dst. Returns a ticket for wait().
  uint64_t submit(int64_t offset, size_t n, uint8_t* dst);
  // Block until the ticket's reads are done; throws std::runtime_error naming the file, offset
  // and cause on a read error or a short read (the file shrank while loaded). `before_blocking`
  // runs (under the reader's lock: keep it trivial) only when the reads are not done yet.
  void wait(uint64_t ticket, void (*before_blocking)() = nullptr);
  // Synchronous read on the calling thread (small on-demand reads such as embedding rows).
  void read_now(int64_t offset, size_t n, uint8_t* dst);

  // Throws if the file's size or modification time changed since it was opened.
  void check_unchanged() const;

  ReaderStats stats() const;
  bool direct() const { return direct_; }
  const std::string& path() const { return path_; }

 private:
  struct Piece {
    uint64_t ticket;
    int64_t offset;
    size_t n;
    uint8_t* dst;
  };
  struct Ticket {
    int remaining = 0;
    std::string error;
  };

  void worker();
  void read_fully(int64_t offset, size_t n, uint8_t* dst, std::string* error) const;

  std::string path_;
  bool direct_;
  int fd_ = -1;
  size_t chunk_bytes_;
  int64_t size_at_open_ = 0;
  int64_t mtime_ns_at_open_ = 0;

  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Piece> queue_;
  std::vector<std::pair<uint64_t, Ticket>> tickets_;  // few in flight: linear search is fine
  uint64_t next_ticket_ = 1;
  bool stop_ = false;
  std::vector<std::thread> threads_;

  std::atomic<uint64_t> bytes_read_{0}, requests_{0}, wait_ns_{0};
};

// 4 KiB-aligned memory for direct-I/O destinations. A buffer of at least one huge page (2 MiB)
// is mapped on a huge-page boundary and asks for transparent huge pages: a direct read into
// physically contiguous memory is one scatter-gather segment instead of one per 4 KiB page.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void release();

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;  // from mmap (huge-page aligned), else from posix_memalign
};

constexpr size_t kHugePage = size_t{2} << 20;

inline size_t align_up(size_t n, size_t a = kIoAlignment) { return (n + a - 1) / a * a; }
inline int64_t align_down(int64_t n, int64_t a = kIoAlignment) { return n / a * a; }

}  // namespace ef::memory
