// How much parallel CPU this machine really gives: the same ALU-bound loop
// on one thread, then on N threads at once. Prints the throughput of N
// threads relative to one (N = 2: 2.0 on two real cores, 1.0 when the
// "cores" share one physical CPU, below 1.0 when switching between them
// costs on top). bench/run prints it beside the -j measurement, which no
// program can beat.
//
//   cpuscale [N]     # default 2
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

volatile unsigned long g_sink;

void spin() {
    unsigned long x = 0;
    for (unsigned long i = 0; i < 300000000ul; ++i) x += i * i ^ (x >> 7);
    g_sink = x;
}

double run(unsigned n) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (unsigned i = 0; i < n; ++i) ts.emplace_back(spin);
    for (auto& t : ts) t.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
    const unsigned n = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 2;
    if (n < 1) return 2;
    double best1 = 1e9, bestn = 1e9;
    for (int r = 0; r < 3; ++r) {  // best of 3 each, interleaved
        best1 = std::min(best1, run(1));
        bestn = std::min(bestn, run(n));
    }
    std::printf("%.2f\n", n * best1 / bestn);
    return 0;
}
