#include "convert.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <limits>
#include <string_view>

#include "common/error.h"

namespace graphdecode::py {
namespace {

constexpr const char* kWhere = "graphdecode (python)";

[[noreturn]] void refuse(const std::string& field, nb::handle obj, const std::string& msg) {
  throw Error(msg, kWhere, field, repr_text(obj));
}

// An integer (Python int, numpy integer, 0-d torch tensor: anything with __index__), never a
// bool: True as a token id or a count is a mistake, not 1.
bool as_int64(nb::handle obj, long long& out) {
  if (PyBool_Check(obj.ptr()) || !PyIndex_Check(obj.ptr())) return false;
  PyObject* index = PyNumber_Index(obj.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    return false;
  }
  int overflow = 0;
  out = PyLong_AsLongLongAndOverflow(index, &overflow);
  Py_DECREF(index);
  if (overflow != 0 || (out == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    out = overflow < 0 ? std::numeric_limits<long long>::min()
                       : std::numeric_limits<long long>::max();
  }
  return true;
}

std::int32_t checked_i32(long long v, nb::handle obj, const std::string& field) {
  if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
    refuse(field, obj, "does not fit a 32-bit integer");
  return static_cast<std::int32_t>(v);
}

// A 1-D integer array on the host, read without a Python call per element.
bool array_token_ids(nb::handle obj, const std::string& field, std::vector<std::int32_t>& out) {
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(obj, a, /*convert=*/false)) return false;
  if (a.device_type() != nb::device::cpu::value)
    refuse(field, obj, "token ids are read on the host: pass a list or a CPU array");
  if (a.ndim() != 1) refuse(field, obj, "token ids must be a 1-D array");
  const auto n = static_cast<std::int64_t>(a.shape(0));
  const std::int64_t stride = n > 1 ? a.stride(0) : 1;  // elements
  const auto* base = static_cast<const char*>(a.data());
  const nb::dlpack::dtype t = a.dtype();
  if (t.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) &&
      t.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt))
    refuse(field, obj, "token ids must be integers");
  const bool is_signed = t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int);
  const std::size_t bytes = t.bits / 8;
  if (t.lanes != 1 || (bytes != 1 && bytes != 2 && bytes != 4 && bytes != 8))
    refuse(field, obj, "unsupported integer array type");
  out.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const char* p = base + i * stride * static_cast<std::int64_t>(bytes);
    long long v = 0;
    if (is_signed) {
      if (bytes == 1) v = *reinterpret_cast<const std::int8_t*>(p);
      if (bytes == 2) v = *reinterpret_cast<const std::int16_t*>(p);
      if (bytes == 4) v = *reinterpret_cast<const std::int32_t*>(p);
      if (bytes == 8) v = *reinterpret_cast<const std::int64_t*>(p);
    } else {
      std::uint64_t u = 0;
      std::memcpy(&u, p, bytes);  // little-endian host
      v = u > static_cast<std::uint64_t>(std::numeric_limits<long long>::max())
              ? std::numeric_limits<long long>::max()
              : static_cast<long long>(u);
    }
    if (v < std::numeric_limits<std::int32_t>::min() ||
        v > std::numeric_limits<std::int32_t>::max())
      throw Error("does not fit a 32-bit integer", kWhere, field + "[" + std::to_string(i) + "]",
                  std::to_string(v));
    out.push_back(static_cast<std::int32_t>(v));
  }
  return true;
}

}  // namespace

std::string repr_text(nb::handle obj) {
  PyObject* r = PyObject_Repr(obj.ptr());
  if (r == nullptr) {
    PyErr_Clear();
    return "<unprintable>";
  }
  Py_ssize_t n = 0;
  const char* s = PyUnicode_AsUTF8AndSize(r, &n);
  std::string out = s ? std::string(s, static_cast<std::size_t>(n)) : "<unprintable>";
  if (!s) PyErr_Clear();
  Py_DECREF(r);
  constexpr std::size_t kMax = 80;  // a long prompt's repr would bury the message
  if (out.size() > kMax) out = out.substr(0, kMax - 3) + "...";
  return out;
}

std::vector<std::int32_t> token_ids(nb::handle obj, const std::string& field) {
  if (PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()) || PyByteArray_Check(obj.ptr()))
    refuse(field, obj, "expects token ids, not text: tokenize first");
  std::vector<std::int32_t> out;
  if (array_token_ids(obj, field, out)) return out;
  PyObject* it = PyObject_GetIter(obj.ptr());
  if (it == nullptr) {
    PyErr_Clear();
    refuse(field, obj, "must be a sequence of token ids (ints) or a 1-D integer array");
  }
  std::size_t i = 0;
  while (PyObject* item = PyIter_Next(it)) {
    const nb::handle h(item);
    long long v = 0;
    const std::string at = field + "[" + std::to_string(i) + "]";
    const bool ok = as_int64(h, v);
    if (!ok || v < std::numeric_limits<std::int32_t>::min() ||
        v > std::numeric_limits<std::int32_t>::max()) {
      const std::string value = repr_text(h);
      Py_DECREF(item);
      Py_DECREF(it);
      throw Error(ok ? "does not fit a 32-bit integer" : "a token id must be an int", kWhere, at,
                  value);
    }
    out.push_back(static_cast<std::int32_t>(v));
    Py_DECREF(item);
    ++i;
  }
  Py_DECREF(it);
  if (PyErr_Occurred()) {  // the iterator itself raised
    PyErr_Clear();
    refuse(field, obj, "could not be iterated");
  }
  return out;
}

std::int32_t to_i32(nb::handle obj, const std::string& field) {
  long long v = 0;
  if (!as_int64(obj, v)) refuse(field, obj, "must be an int");
  return checked_i32(v, obj, field);
}

std::uint64_t to_u64(nb::handle obj, const std::string& field) {
  if (PyBool_Check(obj.ptr()) || !PyIndex_Check(obj.ptr())) refuse(field, obj, "must be an int");
  PyObject* index = PyNumber_Index(obj.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    refuse(field, obj, "must be an int");
  }
  const unsigned long long v = PyLong_AsUnsignedLongLong(index);
  Py_DECREF(index);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    refuse(field, obj, "must be in [0, 2**64)");
  }
  return v;
}

double to_f64(nb::handle obj, const std::string& field) {
  if (PyBool_Check(obj.ptr())) refuse(field, obj, "must be a number");
  const double v = PyFloat_AsDouble(obj.ptr());
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    refuse(field, obj, "must be a number");
  }
  return v;
}

bool to_bool(nb::handle obj, const std::string& field) {
  if (!PyBool_Check(obj.ptr())) refuse(field, obj, "must be True or False");
  return obj.ptr() == Py_True;
}

RequestSpec request_spec(nb::handle prompt, nb::handle max_new_tokens, nb::handle stop_tokens,
                         nb::dict sampling, nb::handle speculate) {
  RequestSpec s;
  s.prompt = token_ids(prompt, "prompt");
  s.max_new_tokens = to_i32(max_new_tokens, "max_new_tokens");
  if (!stop_tokens.is_none()) s.stop_tokens = token_ids(stop_tokens, "stop_tokens");
  for (auto [key, value] : sampling) {
    const std::string k = nb::cast<std::string>(nb::str(key));
    const std::string field = "sampling." + k;
    if (value.is_none()) continue;
    if (k == "temperature") {
      s.sampling.temperature = static_cast<float>(to_f64(value, field));
    } else if (k == "top_k") {
      s.sampling.top_k = to_i32(value, field);
    } else if (k == "top_p") {
      s.sampling.top_p = static_cast<float>(to_f64(value, field));
    } else if (k == "seed") {
      s.sampling.seed = to_u64(value, field);
    } else {
      refuse(field, value, "unknown sampling parameter (temperature, top_k, top_p, seed)");
    }
  }
  s.speculate = to_bool(speculate, "speculate");
  return s;
}

EncoderStates encoder_states(nb::handle obj, const std::string& field, int& device_id) {
  EncoderStates e;
  device_id = -1;
  if (obj.is_none()) return e;
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(obj, a, /*convert=*/false))
    refuse(field, obj, "must be an array offering DLPack: bfloat16 [encoder_len, hidden]");
  if (a.ndim() != 2) refuse(field, obj, "must be 2-D: [encoder_len, hidden]");
  const nb::dlpack::dtype t = a.dtype();
  if (t.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) || t.bits != 16 ||
      t.lanes != 1)
    refuse(field, obj, "must be bfloat16 (the engine reads bf16 states)");
  const auto rows = static_cast<std::int64_t>(a.shape(0));
  const auto cols = static_cast<std::int64_t>(a.shape(1));
  if (rows > 1 && cols > 0 && (a.stride(1) != 1 || a.stride(0) != cols))
    refuse(field, obj, "must be C-contiguous (torch: .contiguous())");
  if (rows == 1 && cols > 1 && a.stride(1) != 1)
    refuse(field, obj, "must be C-contiguous (torch: .contiguous())");
  if (a.device_type() == nb::device::cuda::value) {
    e.on_device = true;
    device_id = static_cast<int>(a.device_id());
  } else if (a.device_type() != nb::device::cpu::value) {
    refuse(field, obj, "must be in host memory or on a CUDA device");
  }
  if (rows > std::numeric_limits<std::int32_t>::max() ||
      cols > std::numeric_limits<std::int32_t>::max())
    refuse(field, obj, "too large");
  e.length = static_cast<std::int32_t>(rows);
  e.width = static_cast<std::int32_t>(cols);
  e.data = rows > 0 ? static_cast<const std::uint16_t*>(a.data()) : nullptr;  // 0 rows: text only
  return e;
}

EngineConfig engine_config(nb::dict options) {
  EngineConfig c;
  for (auto [key, value] : options) {
    const std::string k = nb::cast<std::string>(nb::str(key));
    if (value.is_none()) continue;  // None keeps the default
    if (k == "max_batch") {
      c.max_batch = to_i32(value, k);
    } else if (k == "max_step_tokens") {
      c.max_step_tokens = to_i32(value, k);
    } else if (k == "max_context") {
      c.max_context = to_i32(value, k);
    } else if (k == "kv_pages") {
      c.kv_pages = to_i32(value, k);
    } else if (k == "sliding_pages") {
      c.sliding_pages = to_i32(value, k);
    } else if (k == "max_encoder_len") {
      c.max_encoder_len = to_i32(value, k);
    } else if (k == "cross_pages") {
      c.cross_pages = to_i32(value, k);
    } else if (k == "page_size") {
      c.page_size = to_i32(value, k);
    } else if (k == "use_graphs") {
      c.use_graphs = to_bool(value, k);
    } else if (k == "pipeline") {
      c.pipeline = to_bool(value, k);
    } else if (k == "deterministic") {
      c.deterministic = to_bool(value, k);
    } else if (k == "prefix_cache") {
      c.prefix_cache = to_bool(value, k);
    } else if (k == "speculative.max_draft_tokens") {
      c.speculative.max_draft_tokens = to_i32(value, k);
    } else if (k == "speculative.proposer") {
      const std::string name = PyUnicode_Check(value.ptr()) ? nb::cast<std::string>(value) : "";
      if (name == "draft") {
        c.speculative.proposer = SpecProposer::kDraftModel;
      } else if (name == "ngram") {
        c.speculative.proposer = SpecProposer::kNgram;
      } else if (name == "eagle") {
        c.speculative.proposer = SpecProposer::kEagle;
      } else {
        refuse(k, value,
               "must be \"draft\" (a draft model), \"ngram\" (prompt lookup) or \"eagle\" (an "
               "EAGLE head)");
      }
    } else if (k == "speculative.ngram_max") {
      c.speculative.ngram.max_ngram = to_i32(value, k);
    } else if (k == "speculative.ngram_min") {
      c.speculative.ngram.min_ngram = to_i32(value, k);
    } else if (k == "speculative.k_by_batch") {
      PyObject* it = PyObject_GetIter(value.ptr());
      if (it == nullptr) {
        PyErr_Clear();
        refuse(k, value, "must be a list of (max_batch, k) pairs");
      }
      nb::object iter = nb::steal(it);
      std::size_t i = 0;
      while (PyObject* item = PyIter_Next(it)) {
        nb::object rule = nb::steal(item);
        const std::string at = k + "[" + std::to_string(i++) + "]";
        if (!PySequence_Check(item) || PySequence_Size(item) != 2) {
          PyErr_Clear();
          refuse(at, rule, "must be a (max_batch, k) pair");
        }
        nb::object b = nb::steal(PySequence_GetItem(item, 0));
        nb::object kk = nb::steal(PySequence_GetItem(item, 1));
        c.speculative.k_by_batch.push_back({to_i32(b, at + ".max_batch"), to_i32(kk, at + ".k")});
      }
      if (PyErr_Occurred()) {
        PyErr_Clear();
        refuse(k, value, "could not be iterated");
      }
    } else {
      refuse(k, value, "unknown engine option");
    }
  }
  return c;
}

}  // namespace graphdecode::py
