// Stage: process address spaces from MMAP/MMAP2/COMM(exec)/FORK records, in
// time order, so a sample's user addresses can be tied to the file mapped
// there at that moment.
//
//   ProcessMaps maps;                 // an EventSink: put it before the unwinder
//   const AddressSpace* as = maps.space(sample.pid);
//   const Mapping* m = as ? as->find(ip) : nullptr;
//
// Threads share their process's space. exec (COMM with PERF_RECORD_MISC_COMM_EXEC)
// starts an empty space: a Python started through the pyenv shim (bash that
// execs) must not be unwound with bash's maps. fork copies the parent's.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "gilscan/perfdata/session.h"

namespace gilscan {

class KernelMapsLog;

struct Mapping {
    uint64_t start = 0, end = 0, pgoff = 0;
    std::string path;
    std::string build_id;  // hex, from MMAP2's build-id form when recorded
    uint64_t ino = 0;
    bool exec = true;
};

struct AddressSpace {
    int32_t pid = -1;
    uint64_t id = 0;       // unique per space (a new one at every exec)
    uint64_t version = 0;  // bumped whenever a mapping is added
    std::map<uint64_t, Mapping> maps;  // by start
    uint64_t layout = 0;   // layout_key(*this), kept current by ProcessMaps (0: not computed)
    const Mapping* find(uint64_t addr) const;
};

// Identifies the executable mappings of an address space (paths and
// addresses): spaces with the same layout share a Dwfl and frame names.
uint64_t layout_key(const AddressSpace& as);
// as.layout when ProcessMaps keeps it, else computed (hashes every path).
inline uint64_t layout_of(const AddressSpace& as) { return as.layout ? as.layout : layout_key(as); }

class ProcessMaps final : public EventSink {
public:
    void on_mmap(const MmapEvent& e) override;
    void on_comm(const CommEvent& e) override;
    void on_fork(const TaskEvent& e) override;

    const AddressSpace* space(int32_t pid) const;
    // The space as it is now, kept unchanged for as long as the caller holds
    // it (copy-on-write: later mappings go to a new copy). For worker threads.
    std::shared_ptr<const AddressSpace> snapshot(int32_t pid) const;
    size_t spaces() const { return spaces_.size(); }
    // The kernel's own maps (pid -1) are no process's: they go to this log
    // (kernel_symbols.h), for naming kernel frames on another boot.
    void set_kernel_log(std::shared_ptr<KernelMapsLog> log) { kernel_log_ = std::move(log); }

private:
    AddressSpace& fresh(int32_t pid);
    AddressSpace& writable(std::shared_ptr<AddressSpace>& sp);
    std::unordered_map<int32_t, std::shared_ptr<AddressSpace>> spaces_;
    uint64_t next_id_ = 1;
    std::shared_ptr<KernelMapsLog> kernel_log_;
};

}  // namespace gilscan
