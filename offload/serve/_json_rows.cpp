// The scoring service's common JSON infer body, read in one C call: the rows of
//   {"inputs": [{"name": N, "datatype": D, "shape": [b, f], "data": [v, ...]}]}
// (keys in any order, JSON whitespace anywhere) as a float32 [b, f] array, or None for every
// other body, which then takes msgspec's decoder (offload/serve/oip.py, parse_infer). Built and
// loaded by offload/serve/json_rows.py; the reasons and the measurements are there.
//
// What it takes it must read exactly as msgspec's decoder and stack_rows do, so it takes only
// what it can read that way and gives None for the rest:
// - strings only without escapes or control characters, compared byte for byte with the
//   model's input name and datatype; keys only "inputs" (once) and, in the tensor, the four
//   (each once). An "id", "parameters", "outputs" or any other key: None.
// - shape: two plain non-negative integers (no sign, fraction, exponent or leading zero),
//   b in [1, max_batch], f == width, len(data) == b * f.
// - data: JSON numbers only (the grammar of RFC 8259, section 6, checked here: from_chars alone
//   takes more, "inf", "nan"). Each is read by std::from_chars (C++17; libstdc++ 12 reads
//   decimal with fast_float's Eisel-Lemire algorithm and falls back to exact arithmetic):
//   correctly rounded to double, as msgspec's reader is, with no locale and no copy (glibc's
//   strtod took a multi-precision path for most 17-digit numbers, ~1 us a row here). An integer
//   of at most 15 digits is exact either way, and "-0" is the int 0, so +0.0, as msgspec gives
//   an int in a float list. Then the double's FP32 cast, as struct.pack("f") makes it. None for
//   a longer integer, a number from_chars reports out of range (overflow, underflow), and an
//   FP32 value that is infinite or +-FP32_MAX: those take the exact range check of stack_rows.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <charconv>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

struct Cursor {
    const char* p;
    const char* end;
};

inline void skip_ws(Cursor& c) {
    while (c.p < c.end && (*c.p == ' ' || *c.p == '\t' || *c.p == '\n' || *c.p == '\r')) c.p++;
}

inline bool take(Cursor& c, char ch) {
    skip_ws(c);
    if (c.p < c.end && *c.p == ch) {
        c.p++;
        return true;
    }
    return false;
}

inline bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

// A string with neither escapes nor control characters: its bytes between the quotes.
bool plain_string(Cursor& c, const char** s, Py_ssize_t* n) {
    skip_ws(c);
    if (c.p >= c.end || *c.p != '"') return false;
    const char* b = ++c.p;
    while (c.p < c.end) {
        unsigned char ch = static_cast<unsigned char>(*c.p);
        if (ch == '"') {
            *s = b;
            *n = c.p - b;
            c.p++;
            return true;
        }
        if (ch == '\\' || ch < 0x20) return false;
        c.p++;
    }
    return false;
}

inline bool equals(const char* s, Py_ssize_t n, const char* want, Py_ssize_t wn) {
    return n == wn && std::memcmp(s, want, static_cast<size_t>(n)) == 0;
}

// A plain non-negative integer of at most 9 digits, no leading zero.
bool small_int(Cursor& c, long* out) {
    skip_ws(c);
    const char* b = c.p;
    if (c.p >= c.end || !is_digit(*c.p)) return false;
    if (*c.p == '0') {
        c.p++;
        if (c.p < c.end && is_digit(*c.p)) return false;
        *out = 0;
        return true;
    }
    long v = 0;
    while (c.p < c.end && is_digit(*c.p)) {
        if (c.p - b >= 9) return false;
        v = v * 10 + (*c.p - '0');
        c.p++;
    }
    *out = v;
    return true;
}

// One JSON number, as the double msgspec's decoder gives it in a list of floats.
bool number(Cursor& c, double* out) {
    skip_ws(c);
    const char* b = c.p;
    const char* p = c.p;
    const char* end = c.end;
    if (p < end && *p == '-') p++;
    if (p >= end) return false;
    const char* digits = p;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && is_digit(*p)) p++;
    } else {
        return false;
    }
    const char* int_end = p;
    bool integer = true;
    if (p < end && *p == '.') {
        integer = false;
        p++;
        if (p >= end || !is_digit(*p)) return false;
        while (p < end && is_digit(*p)) p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        integer = false;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || !is_digit(*p)) return false;
        while (p < end && is_digit(*p)) p++;
    }
    if (integer && int_end - digits > 15) return false;
    double v;
    std::from_chars_result r = std::from_chars(b, p, v);
    if (r.ec != std::errc() || r.ptr != p) return false;
    if (integer && v == 0.0) v = 0.0;  // "-0" is the int 0
    *out = v;
    c.p = p;
    return true;
}

struct Want {
    const char* name;
    Py_ssize_t name_n;
    const char* datatype;
    Py_ssize_t datatype_n;
    long width;
    long max_batch;
};

// The tensor object; values into vals (at most max_batch * width of them).
bool tensor(Cursor& c, const Want& w, std::vector<float>& vals, long* rows) {
    if (!take(c, '{')) return false;
    bool seen_name = false, seen_type = false, seen_shape = false, seen_data = false;
    long b = 0, f = 0;
    size_t count = 0;
    const size_t cap = static_cast<size_t>(w.max_batch) * static_cast<size_t>(w.width);
    do {
        const char* k;
        Py_ssize_t kn;
        if (!plain_string(c, &k, &kn) || !take(c, ':')) return false;
        if (equals(k, kn, "name", 4)) {
            const char* s;
            Py_ssize_t n;
            if (seen_name || !plain_string(c, &s, &n) || !equals(s, n, w.name, w.name_n)) return false;
            seen_name = true;
        } else if (equals(k, kn, "datatype", 8)) {
            const char* s;
            Py_ssize_t n;
            if (seen_type || !plain_string(c, &s, &n) || !equals(s, n, w.datatype, w.datatype_n)) return false;
            seen_type = true;
        } else if (equals(k, kn, "shape", 5)) {
            if (seen_shape || !take(c, '[') || !small_int(c, &b) || !take(c, ',') || !small_int(c, &f) || !take(c, ']')) return false;
            seen_shape = true;
        } else if (equals(k, kn, "data", 4)) {
            if (seen_data || !take(c, '[')) return false;
            seen_data = true;
            if (!take(c, ']')) {
                do {
                    double d;
                    if (count >= cap || !number(c, &d) || !std::isfinite(d)) return false;
                    float v = static_cast<float>(d);
                    if (!std::isfinite(v) || std::fabs(v) == FLT_MAX) return false;
                    vals[count++] = v;
                } while (take(c, ','));
                if (!take(c, ']')) return false;
            }
        } else {
            return false;
        }
    } while (take(c, ','));
    if (!take(c, '}')) return false;
    if (!(seen_name && seen_type && seen_shape && seen_data)) return false;
    if (f != w.width || b < 1 || b > w.max_batch || count != static_cast<size_t>(b) * static_cast<size_t>(f)) return false;
    *rows = b;
    return true;
}

// rows(body, name, datatype, width, max_batch) -> float32 [b, width] ndarray, or None.
PyObject* rows(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "rows(body, name, datatype, width, max_batch): 5 arguments");
        return nullptr;
    }
    char* body;
    Py_ssize_t body_n;
    Want w;
    // Any other buffer (bytearray, memoryview) is msgspec's to read.
    if (!PyBytes_CheckExact(args[0])) Py_RETURN_NONE;
    body = PyBytes_AS_STRING(args[0]);
    body_n = PyBytes_GET_SIZE(args[0]);
    // str's UTF-8 form, cached in the object after its first use: no copy per call.
    if ((w.name = PyUnicode_AsUTF8AndSize(args[1], &w.name_n)) == nullptr) return nullptr;
    if ((w.datatype = PyUnicode_AsUTF8AndSize(args[2], &w.datatype_n)) == nullptr) return nullptr;
    w.width = PyLong_AsLong(args[3]);
    if (w.width == -1 && PyErr_Occurred()) return nullptr;
    w.max_batch = PyLong_AsLong(args[4]);
    if (w.max_batch == -1 && PyErr_Occurred()) return nullptr;
    if (w.width < 1 || w.max_batch < 1 || w.width > (1L << 20) || w.max_batch > (1L << 20)) {
        PyErr_SetString(PyExc_ValueError, "rows: width and max_batch must be in [1, 2**20]");
        return nullptr;
    }
    // The values are read into a buffer of this thread's, grown to the largest batch asked for,
    // and copied into the array once the whole body has been read.
    const size_t cap = static_cast<size_t>(w.max_batch) * static_cast<size_t>(w.width);
    static thread_local std::vector<float> vals;
    if (vals.size() < cap) vals.resize(cap);
    Cursor c{body, body + body_n};
    long b = 0;
    bool ok = take(c, '{');
    bool seen_inputs = false;
    if (ok) {
        do {
            const char* k;
            Py_ssize_t kn;
            if (!plain_string(c, &k, &kn) || !take(c, ':') || !equals(k, kn, "inputs", 6) || seen_inputs) {
                ok = false;
                break;
            }
            seen_inputs = true;
            if (!take(c, '[') || !tensor(c, w, vals, &b) || !take(c, ']')) {
                ok = false;
                break;
            }
        } while (take(c, ','));
    }
    if (ok) {
        ok = seen_inputs && take(c, '}');
        skip_ws(c);
        ok = ok && c.p == c.end;
    }
    if (!ok) Py_RETURN_NONE;
    npy_intp dims[2] = {b, w.width};
    PyObject* out = PyArray_SimpleNew(2, dims, NPY_FLOAT32);
    if (out == nullptr) return nullptr;
    std::memcpy(PyArray_DATA(reinterpret_cast<PyArrayObject*>(out)), vals.data(), static_cast<size_t>(b * w.width) * sizeof(float));
    return out;
}

PyMethodDef methods[] = {
    {"rows", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(rows)), METH_FASTCALL,
     "rows(body, name, datatype, width, max_batch): the common infer body's rows as float32 [b, width], or None."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_json_rows", nullptr, -1, methods};

}  // namespace

extern "C" PyMODINIT_FUNC PyInit__json_rows(void) {
    import_array();
    return PyModule_Create(&module);
}
