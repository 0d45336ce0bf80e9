// The mappings an unwinder's frames fall in, with their modules and load
// biases, remembered across frames and samples.
//
//   MappingMemo maps;
//   maps.bind(space, modules);             // before each sample's unwind
//   if (const Mapping* m = maps.find(pc)) { const MappingMemo::Entry& e = maps.entry(*m); ... }
//
// A stack's frames are mostly in a few binaries. The shared ModuleCache
// takes a lock and searches a std::map by build-id (3% of a DWARF capture's
// instructions), Module::bias_for walks the binary's PT_LOADs, and
// AddressSpace::find walks a std::map of some hundred mappings (2%).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "gilscan/symbols/modules.h"
#include "gilscan/symbols/process_maps.h"

namespace gilscan {

class MappingMemo {
public:
    struct Entry {
        const Mapping* map = nullptr;  // valid while bind keeps it
        bool used = false;
        uint64_t start = 0, pgoff = 0;
        std::string path, build_id;
        const Module* mod = nullptr;
        std::optional<uint64_t> bias;  // mod->bias_for(the mapping)
    };

    // Before an unwind in `space`: the entries' Mapping pointers are valid
    // only for the object they were found in, as it was. ProcessMaps bumps
    // a space's version at every change (a copy made for a snapshot is
    // changed, so bumped, at once) and gives each new space a new id, so
    // the same object at the same id and version has the same mappings.
    void bind(const AddressSpace& space, ModuleCache& modules);

    // The mapping holding addr, as space.find(addr) would return it.
    // Mappings never overlap (ProcessMaps cuts what a new one covers), so a
    // pc inside the one found last is in that one.
    const Mapping* find(uint64_t addr) {
        if (last_ && addr >= last_->start && addr < last_->end) return last_;
        const Mapping* m = space_->find(addr);
        if (m) last_ = m;
        return m;
    }

    // m's module and bias. An entry is found by the Mapping's address while
    // the space is unchanged, else by what the module and bias are a
    // function of: path and build-id (ModuleCache::get), start and pgoff
    // (bias_for). The second way keeps the entries when the samples move
    // between processes of one layout (a pool's workers).
    const Entry& entry(const Mapping& m);
    const Module* module(const Mapping& m) { return entry(m).mod; }

private:
    static constexpr int kEntries = 8;
    Entry entries_[kEntries];
    int next_ = 0;
    ModuleCache* modules_ = nullptr;
    const AddressSpace* space_ = nullptr;
    uint64_t space_id_ = 0, space_version_ = 0;
    const Mapping* last_ = nullptr;
};

}  // namespace gilscan
