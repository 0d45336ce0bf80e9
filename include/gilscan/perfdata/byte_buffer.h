// ChunkBytes — a byte vector for large buffers that are filled right after
// they are sized: read chunks (record_stream) and output buffers (output_file).
//
//   ChunkBytes b;
//   b.resize(2u << 20);          // no zero fill; from 2 MiB on, huge pages
//   size_t n = pread(fd, b.data(), b.size(), off);
//   std::vector<Entry, UninitAllocator<Entry>> v;   // any vector: resize() without a fill
//   std::vector<Sym, PrefaultAllocator<Sym>> syms;  // the same, its pages present at once
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

namespace gilscan {

// An allocator whose resize() leaves new elements uninitialised: a buffer
// that is about to be overwritten (by pread, zstd, trace text, a sort's
// output) costs as much again when zero-filled first. (Also the ordering
// queue's entry buffers: their zero fill was 1% of the reader thread.)
template <class T>
struct UninitAllocator : std::allocator<T> {
    template <class U>
    struct rebind {
        using other = UninitAllocator<U>;
    };
    UninitAllocator() = default;
    template <class U>
    UninitAllocator(const UninitAllocator<U>&) noexcept {}
    template <class U>
    void construct(U* p) noexcept {
        ::new (static_cast<void*>(p)) U;  // default-initialized: left as it is
    }
    template <class U, class... A>
    void construct(U* p, A&&... a) {
        ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
    }
};

// The same, with chunk-sized buffers on transparent huge pages: one page
// fault per 2 MiB instead of 512 the first time a buffer is filled.
template <class T>
struct HugeUninitAllocator : UninitAllocator<T> {
    template <class U>
    struct rebind {
        using other = HugeUninitAllocator<U>;
    };
    HugeUninitAllocator() = default;
    template <class U>
    HugeUninitAllocator(const HugeUninitAllocator<U>&) noexcept {}
    T* allocate(size_t n) {
        const size_t bytes = n * sizeof(T);
        if (bytes < kHuge) return std::allocator<T>::allocate(n);
        void* p = std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
        if (!p) throw std::bad_alloc();
        ::madvise(p, bytes, MADV_HUGEPAGE);
        return static_cast<T*>(p);
    }
    void deallocate(T* p, size_t n) {
        if (n * sizeof(T) < kHuge) return std::allocator<T>::deallocate(p, n);
        std::free(p);
    }
    static constexpr size_t kHuge = 2u << 20;
};
using ChunkBytes = std::vector<uint8_t, HugeUninitAllocator<uint8_t>>;

// Makes the pages of [p, p + bytes) present and writable with one call
// (MADV_POPULATE_WRITE, Linux 5.14) instead of a page fault each the first
// time they are written. Why: one call costs far less than a
// fault per page. Harmless for pages that are present
// already (heap memory reused), and where the call fails (an older kernel:
// the faults come as before). Contents are kept.
inline void prefault(const void* p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
    static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    if (bytes == 0) return;
    const uintptr_t from = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
    const uintptr_t to = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) & ~(page - 1);
    ::madvise(reinterpret_cast<void*>(from), to - from, MADV_POPULATE_WRITE);
#else
    (void)p;
    (void)bytes;
#endif
}

// An allocator (resize() without a fill, as UninitAllocator) whose
// allocations of kPrefaultFrom bytes and up are prefaulted: for arrays that
// are sized once and then filled or zeroed whole (an ELF file's symbols, the
// trace writer's tables, the reader's batches), one call instead of a fault
// per page.
template <class T>
struct PrefaultAllocator : UninitAllocator<T> {
    template <class U>
    struct rebind {
        using other = PrefaultAllocator<U>;
    };
    PrefaultAllocator() = default;
    template <class U>
    PrefaultAllocator(const PrefaultAllocator<U>&) noexcept {}
    T* allocate(size_t n) {
        T* p = std::allocator<T>::allocate(n);
        if (n * sizeof(T) >= kPrefaultFrom) prefault(p, n * sizeof(T));
        return p;
    }
    static constexpr size_t kPrefaultFrom = 32u << 10;
};

// Copies n bytes, for the short strings of trace events ("R+", "GIL wait",
// a comm): two overlapping loads and stores, reading and writing only
// [0, n), instead of a call to memcpy per string (always inlined: with
// link-time optimization GCC made it a call of its own again).
[[gnu::always_inline]] inline void copy_short(char* d, const char* s, size_t n) {
    if (n >= 8 && n <= 16) {
        uint64_t a, b;
        std::memcpy(&a, s, 8);
        std::memcpy(&b, s + n - 8, 8);
        std::memcpy(d, &a, 8);
        std::memcpy(d + n - 8, &b, 8);
    } else if (n >= 4 && n < 8) {
        uint32_t a, b;
        std::memcpy(&a, s, 4);
        std::memcpy(&b, s + n - 4, 4);
        std::memcpy(d, &a, 4);
        std::memcpy(d + n - 4, &b, 4);
    } else if (n > 16) {
        std::memcpy(d, s, n);
    } else {
        for (size_t i = 0; i < n; ++i) d[i] = s[i];  // 0-3 bytes (an empty view's data() may be null)
    }
}

// Whether a and b hold the same bytes, for short strings (a comm, a state
// name): the sizes, then two overlapping loads of each, inline, instead of
// a call to memcmp per comparison.
[[gnu::always_inline]] inline bool same_short(std::string_view a, std::string_view b) {
    const size_t n = a.size();
    if (n != b.size()) return false;
    const char* x = a.data();
    const char* y = b.data();
    if (n >= 8 && n <= 16) {
        uint64_t x0, x1, y0, y1;
        std::memcpy(&x0, x, 8), std::memcpy(&x1, x + n - 8, 8);
        std::memcpy(&y0, y, 8), std::memcpy(&y1, y + n - 8, 8);
        return ((x0 ^ y0) | (x1 ^ y1)) == 0;
    }
    if (n >= 4 && n < 8) {
        uint32_t x0, x1, y0, y1;
        std::memcpy(&x0, x, 4), std::memcpy(&x1, x + n - 4, 4);
        std::memcpy(&y0, y, 4), std::memcpy(&y1, y + n - 4, 4);
        return ((x0 ^ y0) | (x1 ^ y1)) == 0;
    }
    if (n > 16) return std::memcmp(x, y, n) == 0;
    for (size_t i = 0; i < n; ++i)  // 0-3 bytes (an empty view's data() may be null)
        if (x[i] != y[i]) return false;
    return true;
}

}  // namespace gilscan
