/*
 * _fastpath.c - the Python API's two hottest calls, append and append_batch,
 * as plain CPython functions next to the cffi module.
 *
 * Why not cffi for these two: cffi cannot take a Python list, so append_batch
 * used to frame its list with marshal.dumps first, a copy of every payload
 * plus per-item work: 45 us for 1000 items of 110 B, as much as the append
 * itself.  Here the list is walked with the CPython API, each bytes item is
 * kept alive (a reference) and its buffer handed to the core as is.  A single
 * append, through cffi, pays its generic argument conversion (~150 ns); here
 * it is two integer conversions.  Both release the GIL around the core call,
 * as cffi does: an append may wait for the shard lock or an fdatasync.
 *
 * The core is linked once, in the cffi module: storage_c.log passes the
 * addresses of comet_append_vector and comet_append_to (ffi.addressof) with
 * each call, and the stream or shard handle as an integer.  Nothing else of
 * the core is reachable from here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "comet.h"

typedef int64_t (*append_vector_fn)(comet_stream *, uint32_t, const comet_payload *, uint32_t,
                                    uint32_t, int);
typedef int64_t (*append_to_fn)(comet_shard *, const char *, uint32_t);

#define STACK_ITEMS 64

static int arg_count(Py_ssize_t nargs, Py_ssize_t want, const char *name)
{
    if (nargs == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, want, nargs);
    return -1;
}

/* append_list(fn, stream, shard, items, raw_limit, durability): the first
 * entry number or a negative error code; None when an item is not exactly
 * bytes (the caller converts them and calls again). */
static PyObject *append_list(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (arg_count(nargs, 6, "append_list"))
        return NULL;
    append_vector_fn fn = (append_vector_fn)PyLong_AsVoidPtr(args[0]);
    comet_stream *stream = PyLong_AsVoidPtr(args[1]);
    unsigned long shard = PyLong_AsUnsignedLong(args[2]);
    PyObject *seq = args[3];
    unsigned long raw_limit = PyLong_AsUnsignedLong(args[4]);
    long durability = PyLong_AsLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (!fn || !stream || shard > UINT32_MAX || raw_limit > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "append_list: argument out of range");
        return NULL;
    }
    if (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq))
        Py_RETURN_NONE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if ((uint64_t)n > UINT32_MAX / 2)
        return PyLong_FromLong(COMET_E_BATCH_TOO_LARGE);
    comet_payload local[STACK_ITEMS], *items = local;
    PyObject *held_local[STACK_ITEMS], **held = held_local;
    if (n > STACK_ITEMS) {
        items = PyMem_Malloc((size_t)n * sizeof *items);
        held = PyMem_Malloc((size_t)n * sizeof *held);
        if (!items || !held) {
            PyMem_Free(items);
            PyMem_Free(held);
            return PyErr_NoMemory();
        }
    }
    /* The items are read while the GIL is held and kept alive by a reference
     * each, so that another thread changing the list meanwhile frees nothing
     * the core is reading. */
    PyObject **src = PySequence_Fast_ITEMS(seq);
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        PyObject *o = src[i];
        if (!PyBytes_CheckExact(o))
            break;
        Py_INCREF(o);
        held[i] = o;
        items[i].data = PyBytes_AS_STRING(o);
        items[i].len = (uint64_t)PyBytes_GET_SIZE(o);
    }
    int64_t rc = 0;
    int all_bytes = i == n;
    if (all_bytes) {
        Py_BEGIN_ALLOW_THREADS
        rc = fn(stream, (uint32_t)shard, items, (uint32_t)n, (uint32_t)raw_limit, (int)durability);
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t k = 0; k < i; k++)
        Py_DECREF(held[k]);
    if (items != local) {
        PyMem_Free(items);
        PyMem_Free(held);
    }
    if (!all_bytes)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(rc);
}

/* append_to(fn, shard_handle, payload): one bytes entry; the entry number or
 * a negative error code. */
static PyObject *append_to(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (arg_count(nargs, 3, "append_to"))
        return NULL;
    append_to_fn fn = (append_to_fn)PyLong_AsVoidPtr(args[0]);
    comet_shard *sh = PyLong_AsVoidPtr(args[1]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *payload = args[2];
    if (!fn || !sh || !PyBytes_CheckExact(payload)) {
        PyErr_SetString(PyExc_TypeError, "append_to: a shard handle and a bytes payload");
        return NULL;
    }
    Py_ssize_t len = PyBytes_GET_SIZE(payload);
    if ((uint64_t)len > UINT32_MAX)
        return PyLong_FromLong(COMET_E_ENTRY_TOO_LARGE);
    const char *data = PyBytes_AS_STRING(payload);
    int64_t rc;
    Py_INCREF(payload);
    Py_BEGIN_ALLOW_THREADS
    rc = fn(sh, data, (uint32_t)len);
    Py_END_ALLOW_THREADS
    Py_DECREF(payload);
    return PyLong_FromLongLong(rc);
}

static PyMethodDef methods[] = {
    {"append_list", (PyCFunction)(void (*)(void))append_list, METH_FASTCALL,
     "append_list(fn, stream, shard, items, raw_limit, durability)"},
    {"append_to", (PyCFunction)(void (*)(void))append_to, METH_FASTCALL,
     "append_to(fn, shard_handle, payload)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastpath",
    "The Python API's append and append_batch without cffi's per-call conversion.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void)
{
    return PyModule_Create(&module);
}
