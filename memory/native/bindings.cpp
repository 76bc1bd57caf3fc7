// Bindings of memory/native: the layer slot table, the structs a streaming plan is made of (bound
// field by field, so Python builds them directly and the schema lives once, here in C++), the
// statistics the streaming parts keep, and a direct reader for measuring storage.
#include "bind_memory.h"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "arrays.h"
#include "direct_reader.h"
#include "layer_source.h"
#include "neuron_cache.h"
#include "streaming.h"

namespace nb = nanobind;

namespace ef::memory {

void bind_memory(nb::module_& m) {
  using namespace ef::bind;

  // (engine name, layer tensor) of every slot, in Slot order.
  m.def("layer_slots", [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (int i = 0; i < kSlotCount; ++i) {
      const SlotInfo& s = slot_info(static_cast<Slot>(i));
      out.emplace_back(s.name, s.tensor);
    }
    return out;
  });
  // (layer tensor, part of the block that reads it: an index into LAYER_PARTS) of every slot.
  m.def("layer_slot_parts", [] {
    std::vector<std::pair<std::string, int>> out;
    for (int i = 0; i < kSlotCount; ++i) {
      const SlotInfo& s = slot_info(static_cast<Slot>(i));
      out.emplace_back(s.tensor, static_cast<int>(s.part));
    }
    return out;
  });
  static_assert(kLayerParts == 4, "LAYER_PARTS names every LayerPart in order");
  m.attr("LAYER_PARTS") = nb::make_tuple("attention", "ffn_in", "ffn_up", "ffn_out");
  m.attr("MATRIX_SLOTS") = kMatrixSlots;
  m.attr("IO_ALIGNMENT") = kIoAlignment;

  nb::class_<StreamedTensor>(m, "StreamedTensor")
      .def(nb::init<>())
      .def_prop_rw(
          "target", [](const StreamedTensor& t) { return std::string(slot_info(t.target).name); },
          [](StreamedTensor& t, const std::string& name) {
            if (!parse_slot(name, &t.target)) throw KernelError("unknown layer slot '" + name + "'");
          })
      .def_rw("offset", &StreamedTensor::offset)
      .def_prop_rw(
          "fmt", [](const StreamedTensor& t) { return std::string(format_info(t.fmt).name); },
          [](StreamedTensor& t, const std::string& name) { t.fmt = fmt_of(name); })
      .def_rw("rows", &StreamedTensor::rows)
      .def_rw("cols", &StreamedTensor::cols)
      .def_rw("stride", &StreamedTensor::stride);

  nb::class_<StreamUnit>(m, "StreamUnit")
      .def(nb::init<>())
      .def_rw("layer", &StreamUnit::layer)
      .def_prop_rw(  // the layer parts the unit holds: (first, last) indices into LAYER_PARTS
          "parts",
          [](const StreamUnit& u) { return std::pair{static_cast<int>(u.first_part), static_cast<int>(u.last_part)}; },
          [](StreamUnit& u, std::pair<int, int> parts) {
            if (parts.first < 0 || parts.second >= kLayerParts || parts.first > parts.second)
              throw KernelError("a unit's parts are (first, last) indices into LAYER_PARTS, first <= last");
            u.first_part = static_cast<LayerPart>(parts.first);
            u.last_part = static_cast<LayerPart>(parts.second);
          })
      .def_rw("head_chunk", &StreamUnit::head_chunk)
      .def_rw("head_row0", &StreamUnit::head_row0)
      .def_rw("ranges", &StreamUnit::ranges)
      .def_rw("tensors", &StreamUnit::tensors)
      .def_prop_ro("bytes", &StreamUnit::bytes);

  nb::class_<StreamingPlan>(m, "StreamingPlan")
      .def(nb::init<>())
      .def_rw("path", &StreamingPlan::path)
      .def_rw("direct", &StreamingPlan::direct)
      .def_rw("io_threads", &StreamingPlan::io_threads)
      .def_rw("chunk_bytes", &StreamingPlan::chunk_bytes)
      .def_rw("units", &StreamingPlan::units)
      .def_rw("slots", &StreamingPlan::slots)
      .def_rw("prefetch", &StreamingPlan::prefetch)
      .def_rw("staging_bytes", &StreamingPlan::staging_bytes)
      .def_rw("stream_embedding", &StreamingPlan::stream_embedding)
      .def_rw("embedding", &StreamingPlan::embedding);

  nb::class_<SparseLayerSpec>(m, "SparseLayerSpec")
      .def(nb::init<>())
      .def_rw("arena_offset", &SparseLayerSpec::arena_offset)
      .def_rw("stride", &SparseLayerSpec::stride)
      .def_rw("file_slot_of_neuron", &SparseLayerSpec::file_slot_of_neuron)
      .def_rw("pred_threshold", &SparseLayerSpec::pred_threshold)
      .def_rw("act_threshold", &SparseLayerSpec::act_threshold)
      .def_prop_rw(
          "down_fmt", [](const SparseLayerSpec& s) { return s.has_down ? std::string(format_info(s.down).name) : ""; },
          [](SparseLayerSpec& s, const std::string& fmt) {
            s.has_down = !fmt.empty();
            if (s.has_down) s.down = fmt_of(fmt);
          });

  nb::class_<ReaderStats>(m, "ReaderStats")
      .def_ro("bytes_read", &ReaderStats::bytes_read)
      .def_ro("requests", &ReaderStats::requests)
      .def_prop_ro("wait_s", [](const ReaderStats& r) { return static_cast<double>(r.wait_ns) * 1e-9; });
  nb::class_<StreamStats>(m, "StreamStats")
      .def_ro("passes", &StreamStats::passes)
      .def_ro("units_read", &StreamStats::units_read)
      .def_ro("prefetched_units", &StreamStats::prefetched_hits)
      .def_ro("retained_hits", &StreamStats::retained_hits);
  nb::class_<NeuronCacheStats>(m, "NeuronCacheStats")
      .def_ro("lookups", &NeuronCacheStats::lookups)
      .def_ro("hits", &NeuronCacheStats::hits)
      .def_ro("loaded", &NeuronCacheStats::loaded)
      .def_ro("evicted", &NeuronCacheStats::evicted)
      .def_ro("bytes_read", &NeuronCacheStats::bytes_read)
      .def_ro("predicted", &NeuronCacheStats::predicted)
      .def_ro("tokens", &NeuronCacheStats::tokens)
      .def_ro("passes", &NeuronCacheStats::passes)
      .def_ro("reads", &NeuronCacheStats::reads)
      .def_ro("read_pages", &NeuronCacheStats::read_pages);

  m.def("read_pieces", &split_request, nb::arg("n"), nb::arg("chunk_bytes"),
        "The byte counts a streamed read of n bytes is split into, one per I/O request.");

  // The reader the streaming engine uses, for measuring a storage device (`edgeflash probe-io`
  // times `read` calls in Python): all pieces of a read are in flight on the I/O threads at once.
  nb::class_<DirectReader>(m, "DirectReader")
      .def(nb::init<const std::string&, bool, int, size_t>(), nb::arg("path"), nb::arg("direct"),
           nb::arg("threads"), nb::arg("chunk_bytes"))
      .def(
          "read",
          [](DirectReader& r, int64_t offset, Out buffer) {
            uint8_t* dst = const_cast<uint8_t*>(bytes(buffer, "buffer"));
            if (reinterpret_cast<uintptr_t>(dst) % kIoAlignment) throw KernelError("buffer must be 4096-aligned");
            const size_t n = nbytes(buffer);
            nb::gil_scoped_release release;
            r.wait(r.submit(offset, n, dst));
          },
          nb::arg("offset"), nb::arg("buffer"), "Read len(buffer) bytes at offset into buffer, and wait.")
      .def_prop_ro("direct", &DirectReader::direct);
}

}  // namespace ef::memory
