/*
 * _fastpath.c - Log.append, Log.append_batch and Log.ingest, the Python
 * API's hottest calls, as C methods.
 *
 * Why not Python over cffi for these: at a few hundred nanoseconds per call,
 * the wrapper was the cost.  A Python method frame with keyword arguments,
 * its dictionary lookups and cffi's generic argument conversion took ~200 ns
 * of a ~500 ns single append; cffi cannot take a Python list, so
 * append_batch framed its list with marshal first (a copy of every payload);
 * and releasing the GIL around a ~150 ns append costs ~70 ns more.
 *
 * So two small types:
 *   - StreamBase, the base of storage_c.log._Stream: the stream's C handle,
 *     its shard count and the rotation over this process's shards, read
 *     here as struct fields;
 *   - Appender, the base of storage_c.log.Log: append, append_batch and
 *     ingest (a request body: the gateway's call; its cffi wrapper, with a
 *     request struct filled field by field, cost ~1.8 us of a ~2.1 us
 *     single-event ingest).
 * Each takes the fast way only in the common case - a known stream, bytes
 * payloads below the compression threshold, default durability, no key -
 * and otherwise calls the Python method of the same name with a `_general`
 * suffix (Log._append_general, Log._append_batch_general, Log._ingest_general)
 * with the very same arguments, which does everything else and raises the
 * errors.  A body that fails validation is reported by Log._ingest_failed.
 *
 * The fast way appends with COMET_APPEND_NOWAIT holding the GIL: it stores
 * only what needs no sleeping (comet.h, Appends).  Otherwise, with wait=True,
 * the GIL is let go for the same call with COMET_APPEND_WAIT, as cffi would:
 * an append may wait for the shard lock, a rotation or an fdatasync.
 * Payloads are kept alive by a reference each while the GIL is let go
 * (another thread may change the list meanwhile); while it is held nothing
 * can.  With wait=False there is no second call: COMET_E_WOULD_BLOCK is
 * raised as WouldBlock, nothing stored, for a caller on an event loop to
 * make the call again on a thread.
 *
 * comet_ingest always runs with the GIL let go: it validates the whole body
 * first, which for a large one takes long enough to matter.
 *
 * This file is compiled into the cffi module storage_c._comet with the core
 * (storage_c/_build.py), so it calls the core's functions directly and the
 * process holds one copy of the core; storage_c/_native.py loads it from
 * that shared object as the module storage_c._fastpath.  Each stream's
 * handle comes as an integer (the addr argument of StreamBase).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <structmember.h>

#include "comet.h"

#define STACK_ITEMS 64

/* ---- StreamBase ---------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    comet_stream *stream;
    uint32_t shards;
    PyObject *rotation; /* iterator over this process's shards (unkeyed appends) */
} StreamBase;

static int stream_init(StreamBase *self, PyObject *args, PyObject *kwds)
{
    unsigned long long addr;
    unsigned int shards;
    static char *names[] = {"addr", "shards", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KI", names, &addr, &shards))
        return -1;
    self->stream = (comet_stream *)(uintptr_t)addr;
    self->shards = shards;
    return 0;
}

static int stream_traverse(StreamBase *self, visitproc visit, void *arg)
{
    Py_VISIT(self->rotation);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int stream_clear(StreamBase *self)
{
    Py_CLEAR(self->rotation);
    return 0;
}

static void stream_dealloc(StreamBase *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    stream_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMemberDef stream_members[] = {
    {"shards", T_UINT, offsetof(StreamBase, shards), READONLY, "shard count"},
    {"rotation", T_OBJECT, offsetof(StreamBase, rotation), 0,
     "iterator over this process's shards, for unkeyed appends"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot stream_slots[] = {
    {Py_tp_doc, "A stream's handle as the fast appends read it (base of log._Stream)."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, stream_init},
    {Py_tp_dealloc, stream_dealloc},
    {Py_tp_traverse, stream_traverse},
    {Py_tp_clear, stream_clear},
    {Py_tp_members, stream_members},
    {0, NULL},
};

static PyType_Spec stream_spec = {
    "storage_c._fastpath.StreamBase", sizeof(StreamBase), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, stream_slots,
};

/* ---- Appender ------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *streams;        /* the Log's dict: name -> _Stream (a StreamBase) */
    PyTypeObject *stream_type;
    PyTypeObject *batch_result;
    uint64_t threshold;       /* payloads this long or longer go the general way (compression) */
    uint32_t raw_limit;       /* the same, for the core's check of a batch */
    int32_t compress_level;   /* zstd level of events ingested above raw_limit */
} Appender;

static PyObject *str_append_general, *str_append_batch_general, *str_raise;
static PyObject *str_ingest_general, *str_ingest_failed, *str_json, *str_ndjson;
static PyObject *str_shard, *str_key, *str_durability, *str_wait, *kw_shard, *kw_shard_wait;

static int appender_traverse(Appender *self, visitproc visit, void *arg)
{
    Py_VISIT(self->streams);
    Py_VISIT(self->stream_type);
    Py_VISIT(self->batch_result);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int appender_clear(Appender *self)
{
    Py_CLEAR(self->streams);
    Py_CLEAR(self->stream_type);
    Py_CLEAR(self->batch_result);
    return 0;
}

static void appender_dealloc(Appender *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (type->tp_weaklistoffset)
        PyObject_ClearWeakRefs((PyObject *)self);
    appender_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* _fast_init(streams, stream_type, batch_result, threshold, raw_limit, compress_level) */
static PyObject *appender_fast_init(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyDict_CheckExact(args[0]) || !PyType_Check(args[1]) ||
        !PyType_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "_fast_init(streams, stream_type, batch_result, "
                                         "threshold, raw_limit, compress_level)");
        return NULL;
    }
    unsigned long long threshold = PyLong_AsUnsignedLongLong(args[3]);
    unsigned long raw_limit = PyLong_AsUnsignedLong(args[4]);
    long level = PyLong_AsLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (raw_limit > UINT32_MAX || level < INT32_MIN || level > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "_fast_init: raw_limit or compress_level out of range");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(self->streams, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(self->stream_type, (PyTypeObject *)args[1]);
    Py_INCREF(args[2]);
    Py_XSETREF(self->batch_result, (PyTypeObject *)args[2]);
    self->threshold = threshold;
    self->raw_limit = (uint32_t)raw_limit;
    self->compress_level = (int32_t)level;
    Py_RETURN_NONE;
}

/* The call as it came, to the Python method `name` (the general way). */
static PyObject *general(Appender *self, PyObject *name, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames)
{
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *local[8], **stack = local;
    if (total + 1 > 8 && !(stack = PyMem_Malloc((size_t)(total + 1) * sizeof *stack)))
        return PyErr_NoMemory();
    stack[0] = (PyObject *)self;
    for (Py_ssize_t i = 0; i < total; i++)
        stack[1 + i] = args[i];
    PyObject *r = PyObject_VectorcallMethod(name, stack, (size_t)(nargs + 1), kwnames);
    if (stack != local)
        PyMem_Free(stack);
    return r;
}

/* What fast_target found for a call: the stream (NULL: the general way), the
 * shard, a new reference to the shard as an int (when the stream is set),
 * and whether the call said wait=False. */
typedef struct {
    StreamBase *s;
    uint32_t shard;
    PyObject *shard_obj;
    int nowait;
} fast_call;

/* The general way for a call the fast way did not take: as it came, or,
 * when the stream was found (the rotation may have moved), with the shard
 * already chosen: name(*args, shard=shard[, wait=False]), the call's
 * positional arguments (at most max_positional of them) and no other
 * keyword.  Takes c->shard_obj's reference. */
static PyObject *fallback(Appender *self, PyObject *name, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames, fast_call *c, Py_ssize_t max_positional)
{
    if (!c->s || nargs > max_positional) { /* a wrong call: as it came, for its TypeError */
        Py_XDECREF(c->shard_obj);
        return general(self, name, args, nargs, kwnames);
    }
    PyObject *stack[6] = {(PyObject *)self}; /* max_positional is 2 or 3 */
    for (Py_ssize_t i = 0; i < nargs; i++)
        stack[1 + i] = args[i];
    stack[1 + nargs] = c->shard_obj;
    stack[2 + nargs] = Py_False;
    PyObject *r = PyObject_VectorcallMethod(name, stack, (size_t)(nargs + 1),
                                            c->nowait ? kw_shard_wait : kw_shard);
    Py_DECREF(c->shard_obj);
    return r;
}

/* Reads shard=, key=, durability=, wait= (nothing else); 0 when a keyword
 * is unknown. */
static int keywords(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **shard,
                    PyObject **key, PyObject **durability, PyObject **wait)
{
    *shard = *key = *durability = Py_None;
    *wait = Py_True;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i), *v = args[nargs + i];
        if (k == str_shard)
            *shard = v;
        else if (k == str_key)
            *key = v;
        else if (k == str_durability)
            *durability = v;
        else if (k == str_wait)
            *wait = v;
        else
            return 0;
    }
    return 1;
}

/* The stream and shard of a fast append: a known stream, an int shard in
 * range (or the next of the rotation), no key, default durability.  c->s is
 * NULL when the general way is to be taken.  -1 with an exception set on an
 * error. */
static int fast_target(Appender *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                       fast_call *c)
{
    PyObject *shard, *key, *durability, *wait;
    *c = (fast_call){0};
    if (nargs < 2 || !self->streams ||
        !keywords(args, nargs, kwnames, &shard, &key, &durability, &wait) || key != Py_None ||
        durability != Py_None || (wait != Py_True && wait != Py_False) ||
        !PyUnicode_CheckExact(args[0]))
        return 0;
    c->nowait = wait == Py_False;
    PyObject *found = PyDict_GetItemWithError(self->streams, args[0]); /* borrowed */
    if (!found || !PyObject_TypeCheck(found, self->stream_type))
        return PyErr_Occurred() ? -1 : 0;
    StreamBase *s = (StreamBase *)found;
    if (shard == Py_None) {
        if (!s->rotation)
            return 0;
        shard = PyIter_Next(s->rotation);
        if (!shard)
            return PyErr_Occurred() ? -1 : 0;
    } else {
        Py_INCREF(shard);
    }
    unsigned long n = PyLong_CheckExact(shard) ? PyLong_AsUnsignedLong(shard) : ULONG_MAX;
    if (n == (unsigned long)-1 && PyErr_Occurred())
        PyErr_Clear(); /* negative or huge: the general way says so */
    if (n >= s->shards) {
        Py_DECREF(shard);
        return 0;
    }
    c->s = s;
    c->shard = (uint32_t)n;
    c->shard_obj = shard;
    return 0;
}

/* An error code from the core: Log._raise(stream, rc, shard) raises it (the
 * shard goes with WouldBlock, for the retry). */
static PyObject *raise_code(Appender *self, PyObject *stream, int64_t rc, PyObject *shard_obj)
{
    PyObject *code = PyLong_FromLongLong(rc);
    if (!code)
        return NULL;
    PyObject *r = PyObject_CallMethodObjArgs((PyObject *)self, str_raise, stream, code, shard_obj,
                                             NULL);
    Py_DECREF(code);
    Py_XDECREF(r);
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "_raise returned");
    return NULL;
}

/* What an append returns: (shard, entry) as a tuple, or (shard, first,
 * count) as `type` (BatchResult, a tuple subtype) when count >= 0; or the
 * error of a negative rc raised.  Takes shard_obj's reference. */
static PyObject *finish(Appender *self, PyObject *stream, PyObject *shard_obj, int64_t rc,
                        PyTypeObject *type, Py_ssize_t count)
{
    if (rc < 0) {
        PyObject *r = raise_code(self, stream, rc, shard_obj);
        Py_DECREF(shard_obj);
        return r;
    }
    PyObject *first = PyLong_FromLongLong(rc);
    PyObject *n = count >= 0 ? PyLong_FromSsize_t(count) : NULL;
    PyObject *out = !first || (count >= 0 && !n) ? NULL
                    : count >= 0                 ? type->tp_alloc(type, 3)
                                                 : PyTuple_New(2);
    if (!out) {
        Py_DECREF(shard_obj);
        Py_XDECREF(first);
        Py_XDECREF(n);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, shard_obj);
    PyTuple_SET_ITEM(out, 1, first);
    if (n)
        PyTuple_SET_ITEM(out, 2, n);
    return out;
}

static PyObject *appender_append(Appender *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    fast_call c;
    if (fast_target(self, args, nargs, kwnames, &c) < 0)
        return NULL;
    PyObject *payload = nargs == 2 ? args[1] : NULL;
    if (!c.s || !payload || !PyBytes_CheckExact(payload) ||
        (uint64_t)PyBytes_GET_SIZE(payload) >= self->threshold ||
        (uint64_t)PyBytes_GET_SIZE(payload) > UINT32_MAX) {
        return fallback(self, str_append_general, args, nargs, kwnames, &c, 2);
    }
    comet_stream *stream = c.s->stream; /* read before the GIL goes (see vector_waiting) */
    const char *data = PyBytes_AS_STRING(payload);
    uint32_t len = (uint32_t)PyBytes_GET_SIZE(payload);
    int64_t rc = comet_append(stream, c.shard, data, len, 0, COMET_DURABILITY_DEFAULT,
                              COMET_APPEND_NOWAIT);
    if (rc == COMET_E_WOULD_BLOCK && !c.nowait) {
        Py_INCREF(payload);
        Py_BEGIN_ALLOW_THREADS
        rc = comet_append(stream, c.shard, data, len, 0, COMET_DURABILITY_DEFAULT,
                          COMET_APPEND_WAIT);
        Py_END_ALLOW_THREADS
        Py_DECREF(payload);
    }
    return finish(self, args[0], c.shard_obj, rc, NULL, -1);
}

/* items[i] from a list or tuple of exact bytes (n items); 0 when one is not
 * exact bytes. */
static int gather(PyObject *seq, Py_ssize_t n, comet_payload *items)
{
    PyObject **src = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = src[i];
        if (!PyBytes_CheckExact(o))
            return 0;
        items[i].data = PyBytes_AS_STRING(o);
        items[i].len = (uint64_t)PyBytes_GET_SIZE(o);
    }
    return 1;
}

/* The call with COMET_APPEND_WAIT, the GIL let go; every item held by a
 * reference.  The stream's handle is read before: once the GIL is let go,
 * another thread may drop the StreamBase (Log.close); the comet_stream itself
 * stays valid (comet_close keeps the handles' small structs). */
static int64_t vector_waiting(Appender *self, comet_stream *stream, uint32_t shard, PyObject *seq,
                              Py_ssize_t n, const comet_payload *items)
{
    PyObject **src = PySequence_Fast_ITEMS(seq), *held_local[STACK_ITEMS], **held = held_local;
    if (n > STACK_ITEMS && !(held = PyMem_Malloc((size_t)n * sizeof *held))) {
        PyErr_NoMemory();
        return COMET_E_NOMEM;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        held[i] = src[i];
        Py_INCREF(held[i]);
    }
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = comet_append_vector(stream, shard, items, (uint32_t)n, self->raw_limit,
                             COMET_DURABILITY_DEFAULT, COMET_APPEND_WAIT);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(held[i]);
    if (held != held_local)
        PyMem_Free(held);
    return rc;
}

static PyObject *appender_append_batch(Appender *self, PyObject *const *args, Py_ssize_t nargs,
                                       PyObject *kwnames)
{
    fast_call c;
    if (fast_target(self, args, nargs, kwnames, &c) < 0)
        return NULL;
    PyObject *seq = nargs == 2 ? args[1] : NULL;
    Py_ssize_t n = seq && (PyList_CheckExact(seq) || PyTuple_CheckExact(seq))
                       ? PySequence_Fast_GET_SIZE(seq) : -1;
    comet_payload local[STACK_ITEMS], *items = local;
    int64_t rc = COMET_E_WANTS_COMPRESSION;
    if (c.s && nargs == 2 && n > 0 && (uint64_t)n <= UINT32_MAX / 2) {
        if (n > STACK_ITEMS && !(items = PyMem_Malloc((size_t)n * sizeof *items))) {
            Py_DECREF(c.shard_obj);
            return PyErr_NoMemory();
        }
        if (gather(seq, n, items)) {
            rc = comet_append_vector(c.s->stream, c.shard, items, (uint32_t)n, self->raw_limit,
                                     COMET_DURABILITY_DEFAULT, COMET_APPEND_NOWAIT);
            if (rc == COMET_E_WOULD_BLOCK && !c.nowait)
                rc = vector_waiting(self, c.s->stream, c.shard, seq, n, items);
        }
        if (items != local)
            PyMem_Free(items);
        if (PyErr_Occurred()) {
            Py_DECREF(c.shard_obj);
            return NULL;
        }
    }
    if (rc == COMET_E_WANTS_COMPRESSION) /* or not the common case: the general way */
        return fallback(self, str_append_batch_general, args, nargs, kwnames, &c, 2);
    return finish(self, args[0], c.shard_obj, rc, self->batch_result, n);
}

/* COMET_BODY_* of a format argument, or 0 when it is not exactly "json" or
 * "ndjson" (the general way then says what is wrong with it). */
static uint32_t body_format(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3)
        return COMET_BODY_JSON;
    PyObject *f = args[2];
    if (nargs > 3 || !PyUnicode_CheckExact(f))
        return 0;
    if (f == str_json || PyUnicode_Compare(f, str_json) == 0)
        return COMET_BODY_JSON;
    if (f == str_ndjson || PyUnicode_Compare(f, str_ndjson) == 0)
        return COMET_BODY_NDJSON;
    return 0;
}

/* A body the core refused (or another error of the ingest):
 * Log._ingest_failed(stream, rc, index, line, offset, reason) raises it. */
static PyObject *ingest_failed(Appender *self, PyObject *stream, int64_t rc,
                               const comet_ingest_result *res)
{
    PyObject *index = res->error_index == COMET_NO_INDEX ? Py_NewRef(Py_None)
                                                         : PyLong_FromUnsignedLongLong(res->error_index);
    PyObject *code = PyLong_FromLongLong(rc);
    PyObject *line = PyLong_FromUnsignedLongLong(res->error_line);
    PyObject *offset = PyLong_FromUnsignedLongLong(res->error_offset);
    PyObject *reason = PyUnicode_DecodeUTF8(res->error_reason,
                                            (Py_ssize_t)strnlen(res->error_reason,
                                                                sizeof res->error_reason),
                                            "replace");
    if (index && code && line && offset && reason) {
        PyObject *r = PyObject_CallMethodObjArgs((PyObject *)self, str_ingest_failed, stream, code,
                                                 index, line, offset, reason, NULL);
        Py_XDECREF(r);
        if (r && !PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "_ingest_failed returned");
    }
    Py_XDECREF(index);
    Py_XDECREF(code);
    Py_XDECREF(line);
    Py_XDECREF(offset);
    Py_XDECREF(reason);
    return NULL;
}

static PyObject *appender_ingest(Appender *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    fast_call c;
    if (fast_target(self, args, nargs, kwnames, &c) < 0)
        return NULL;
    uint32_t format = c.s ? body_format(args, nargs) : 0;
    Py_buffer view;
    if (!format || PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* a body that is no buffer: the general way says so */
        return fallback(self, str_ingest_general, args, nargs, kwnames, &c, 3);
    }
    comet_ingest_request req = {.body = view.buf, .len = (size_t)view.len, .format = format,
                                .compress_above = self->raw_limit,
                                .compress_level = self->compress_level,
                                .durability = COMET_DURABILITY_DEFAULT,
                                .mode = c.nowait ? COMET_APPEND_NOWAIT : COMET_APPEND_WAIT};
    comet_ingest_result res;
    comet_stream *stream = c.s->stream; /* read before the GIL goes (see vector_waiting) */
    int64_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = comet_ingest(stream, c.shard, &req, &res);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view); /* the view held the body (a bytearray cannot resize meanwhile) */
    if (rc == COMET_E_WOULD_BLOCK)
        return finish(self, args[0], c.shard_obj, rc, NULL, -1); /* raises WouldBlock */
    if (rc < 0) {
        Py_DECREF(c.shard_obj);
        return ingest_failed(self, args[0], rc, &res);
    }
    return finish(self, args[0], c.shard_obj, rc, self->batch_result, (Py_ssize_t)res.count);
}

static PyMethodDef appender_methods[] = {
    {"_fast_init", (PyCFunction)(void (*)(void))appender_fast_init, METH_FASTCALL,
     "_fast_init(streams, stream_type, batch_result, threshold, raw_limit, compress_level)"},
    {"append", (PyCFunction)(void (*)(void))appender_append, METH_FASTCALL | METH_KEYWORDS,
     "append(stream, payload, *, shard=None, key=None, durability=None, wait=True)"
     " -> (shard, entry)\n\n"
     "Appends one entry; returns its id as (shard, entry).\n\n"
     "Without shard or key the entry goes to this process's own shards in turn;\n"
     "with key to hash(key) % shards.  wait=False: WouldBlock, nothing stored,\n"
     "where the append would first have to wait (lock, rotation, sync; comet.h)."},
    {"append_batch", (PyCFunction)(void (*)(void))appender_append_batch,
     METH_FASTCALL | METH_KEYWORDS,
     "append_batch(stream, payloads, *, shard=None, key=None, durability=None, wait=True)"
     " -> BatchResult\n\n"
     "Appends entries atomically, contiguous and in order, in one shard."},
    {"ingest", (PyCFunction)(void (*)(void))appender_ingest, METH_FASTCALL | METH_KEYWORDS,
     "ingest(stream, body, format='json', *, shard=None, key=None, durability=None, wait=True)"
     " -> BatchResult\n\n"
     "Validates a request body (strict JSON, or NDJSON) and appends its events\n"
     "as one atomic batch, exactly as sent apart from insignificant whitespace;\n"
     "on a bad body nothing is stored and InvalidJSON, EntryTooLarge or NoEvents\n"
     "is raised with `fault` (event index, line, byte offset, reason).  The GIL\n"
     "is let go while the core works."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot appender_slots[] = {
    {Py_tp_doc, "The fast appends of storage_c.log.Log (its base)."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, appender_dealloc},
    {Py_tp_traverse, appender_traverse},
    {Py_tp_clear, appender_clear},
    {Py_tp_methods, appender_methods},
    {0, NULL},
};

static PyType_Spec appender_spec = {
    "storage_c._fastpath.Appender", sizeof(Appender), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, appender_slots,
};

/* ---- module -------------------------------------------------------------- */

static int add_type(PyObject *m, PyType_Spec *spec, const char *name)
{
    PyObject *t = PyType_FromSpec(spec);
    if (!t)
        return -1;
    int rc = PyModule_AddObjectRef(m, name, t);
    Py_DECREF(t);
    return rc;
}

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastpath",
    "Log.append, Log.append_batch and Log.ingest in C (see storage_c/_fastpath.c).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void)
{
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    if (!(str_append_general = PyUnicode_InternFromString("_append_general")) ||
        !(str_append_batch_general = PyUnicode_InternFromString("_append_batch_general")) ||
        !(str_raise = PyUnicode_InternFromString("_raise")) ||
        !(str_ingest_general = PyUnicode_InternFromString("_ingest_general")) ||
        !(str_ingest_failed = PyUnicode_InternFromString("_ingest_failed")) ||
        !(str_json = PyUnicode_InternFromString("json")) ||
        !(str_ndjson = PyUnicode_InternFromString("ndjson")) ||
        !(str_shard = PyUnicode_InternFromString("shard")) ||
        !(str_key = PyUnicode_InternFromString("key")) ||
        !(str_durability = PyUnicode_InternFromString("durability")) ||
        !(str_wait = PyUnicode_InternFromString("wait")) ||
        !(kw_shard = PyTuple_Pack(1, str_shard)) ||
        !(kw_shard_wait = PyTuple_Pack(2, str_shard, str_wait)) ||
        add_type(m, &stream_spec, "StreamBase") || add_type(m, &appender_spec, "Appender")) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
