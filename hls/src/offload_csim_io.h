// Host-side I/O for C-simulation programs: raw little-endian arrays over files or stdio.
// Used by the fixed-point proof programs and kernel test benches; never synthesised.
#ifndef OFFLOAD_CSIM_IO_H
#define OFFLOAD_CSIM_IO_H

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace offload_csim {

template <typename T>
std::vector<T> read_array(std::FILE *f, size_t n) {
    std::vector<T> v(n);
    if (n && std::fread(v.data(), sizeof(T), n, f) != n) {
        std::fprintf(stderr, "offload_csim: short read (%zu elements of %zu bytes)\n", n, sizeof(T));
        std::exit(2);
    }
    return v;
}

template <typename T>
void write_array(std::FILE *f, const T *p, size_t n) {
    if (n && std::fwrite(p, sizeof(T), n, f) != n) {
        std::fprintf(stderr, "offload_csim: short write\n");
        std::exit(3);
    }
}

inline uint64_t read_u64(std::FILE *f) { return read_array<uint64_t>(f, 1)[0]; }

}  // namespace offload_csim

#endif
