// What this machine charges for memory a process touches first: N MiB of
// fresh 2 MiB (transparent huge) pages written once, page by page. Prints
// the milliseconds it took. bench/run times it right after `perf script`
// and right after another freshmem, as gilscan is timed right after `perf
// script`: on a VM whose host takes freed guest memory back (free page
// reporting), the first figure is many times the second, and every MiB
// gilscan touches first costs it that much.
//
//   freshmem [MIB]     # default 64
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>

int main(int argc, char** argv) {
    const long mib = argc > 1 ? std::atol(argv[1]) : 64;
    if (mib < 2 || mib > (1l << 20)) return 2;
    constexpr size_t kHuge = 2u << 20;
    const size_t n = static_cast<size_t>(mib) << 20;
    // Anonymous, huge-page aligned, made eligible for huge pages as
    // gilscan's read chunks and output buffers are (byte_buffer.h).
    void* m = ::mmap(nullptr, n + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 1;
    auto* p = reinterpret_cast<volatile char*>((reinterpret_cast<uintptr_t>(m) + kHuge - 1) & ~(kHuge - 1));
    ::madvise(const_cast<char*>(p), n, MADV_HUGEPAGE);
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; i += 4096) p[i] = 1;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%.1f\n", ms);
    return 0;
}
