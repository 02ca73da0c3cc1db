#include "emulator/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace fp4attn::emulator {

void parallel_for(std::int64_t count, int threads, const std::function<void(std::int64_t)>& fn) {
  if (count <= 0) return;
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int workers = static_cast<int>(std::min<std::int64_t>(threads > 0 ? threads : hardware, count));
  std::atomic<std::int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto drain = [&] {
    for (std::int64_t i = next++; i < count && !failed; i = next++) {
      try {
        fn(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(workers - 1));
  for (int t = 1; t < workers; ++t) pool.emplace_back(drain);
  drain();  // the calling thread is the first worker
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace fp4attn::emulator
