// Python -> C++ argument conversion for the graphdecode extension.
//
// Every refusal is a graphdecode::Error naming the field and the value (repr), the same type the
// library throws, so Python sees one exception class (graphdecode.Error, a ValueError) whether a
// value failed here (wrong type, out of the int32 range) or in the library's own rules.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/scheduler.h"

namespace graphdecode::py {

namespace nb = nanobind;

// repr_text(obj), for the value an Error carries.
std::string repr_text(nb::handle obj);

// Token ids from a list / tuple / range / any iterable of ints, or a 1-D integer array on the
// host (numpy, torch CPU tensor: anything DLPack or the buffer protocol offers). A device array,
// text, bools, floats and ids outside int32 are refused naming `field` ("prompt[3]", ...).
std::vector<std::int32_t> token_ids(nb::handle obj, const std::string& field);

// An int that fits int32 / a float / a bool, else Error(field, repr_text(obj)).
std::int32_t to_i32(nb::handle obj, const std::string& field);
double to_f64(nb::handle obj, const std::string& field);
bool to_bool(nb::handle obj, const std::string& field);
std::uint64_t to_u64(nb::handle obj, const std::string& field);

// A request from the keyword arguments of Engine.submit / check_request. `sampling` is a dict with
// the keys temperature, top_k, top_p, seed (missing keys keep SamplingParams' defaults).
RequestSpec request_spec(nb::handle prompt, nb::handle max_new_tokens, nb::handle stop_tokens,
                         nb::dict sampling, nb::handle speculate);

// Encoder states for a cross-attention model: None, or a 2-D bfloat16 C-contiguous array
// [encoder_len, hidden] on the host or a CUDA device, taken by DLPack without a copy (numpy has no
// bf16: torch tensors, or anything else offering __dlpack__). `device_id` gets the CUDA device
// (-1 on the host). The caller keeps `obj` alive while the engine may read the data.
EncoderStates encoder_states(nb::handle obj, const std::string& field, int& device_id);

// EngineConfig from a dict of its field names: max_batch, max_step_tokens, max_context, kv_pages,
// sliding_pages, page_size, use_graphs, pipeline, deterministic, prefix_cache, max_encoder_len,
// cross_pages, and speculative.max_draft_tokens, speculative.k_by_batch (a list of (max_batch, k)
// pairs), speculative.proposer ("draft" or "ngram"), speculative.ngram_max, speculative.ngram_min.
// An unknown key is an Error naming it.
EngineConfig engine_config(nb::dict options);

}  // namespace graphdecode::py
