/*
 * module.c: the chronq._native module itself (one extension built from the files of chronq/csrc; native.h
 * lists them and what each holds).
 *
 * Sections: module state (NativeState: the error classes, the excerpt freelist); errors (raising
 * chronq.errors' CorruptQueueError and ChronqError from any file); the method table (the functions
 * each file exports to Python); PyInit__native (readies the types, adds them and the constants).
 */
#include "native.h"

/* ------------------------------------------------------------------ module state */

NativeState native_state;

/* ------------------------------------------------------------------ errors */

static int load_errors(void) {
    if (native_state.corrupt_queue_error) return 0;
    PyObject *mod = PyImport_ImportModule("chronq.errors");
    if (!mod) return -1;
    native_state.corrupt_queue_error = PyObject_GetAttrString(mod, "CorruptQueueError");
    native_state.chronq_error = PyObject_GetAttrString(mod, "ChronqError");
    Py_DECREF(mod);
    if (!native_state.corrupt_queue_error || !native_state.chronq_error) {
        Py_CLEAR(native_state.corrupt_queue_error);
        Py_CLEAR(native_state.chronq_error);
        return -1;
    }
    return 0;
}

void raise_corrupt(PyObject *name, Py_ssize_t pos, const char *fmt, ...) {
    if (load_errors() < 0) return;
    if (!name || name == Py_None) name = PyUnicode_FromString("<buffer>");
    else Py_INCREF(name);
    if (!name) return;
    va_list ap;
    va_start(ap, fmt);
    PyObject *detail = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (!detail) {
        Py_DECREF(name);
        return;
    }
    PyObject *exc = PyObject_CallFunction(native_state.corrupt_queue_error, "OnO", name, pos, detail);
    Py_DECREF(detail);
    Py_DECREF(name);
    if (exc) {
        PyErr_SetObject(native_state.corrupt_queue_error, exc);
        Py_DECREF(exc);
    }
}

void raise_chronq(const char *fmt, ...) {
    if (load_errors() < 0) return;
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (!msg) return;
    PyErr_SetObject(native_state.chronq_error, msg);
    Py_DECREF(msg);
}

/* ------------------------------------------------------------------ the method table and init */

static PyMethodDef module_methods[] = {
    {"load32", (PyCFunction)(void (*)(void))py_load32, METH_FASTCALL, "load32(buf, off) -> int (acquire)"},
    {"load64", (PyCFunction)(void (*)(void))py_load64, METH_FASTCALL, "load64(buf, off) -> int (acquire)"},
    {"store32", (PyCFunction)(void (*)(void))py_store32, METH_FASTCALL, "store32(buf, off, v) (release)"},
    {"store64", (PyCFunction)(void (*)(void))py_store64, METH_FASTCALL, "store64(buf, off, v) (release)"},
    {"cas32", (PyCFunction)(void (*)(void))py_cas32, METH_FASTCALL, "cas32(buf, off, expected, new) -> bool"},
    {"cas64", (PyCFunction)(void (*)(void))py_cas64, METH_FASTCALL, "cas64(buf, off, expected, new) -> bool"},
    {"set_max64", (PyCFunction)(void (*)(void))py_set_max64, METH_FASTCALL, "set_max64(buf, off, v) -> new value"},
    {"set_min64", (PyCFunction)(void (*)(void))py_set_min64, METH_FASTCALL, "set_min64(buf, off, v) -> new value"},
    {"add64", (PyCFunction)(void (*)(void))py_add64, METH_FASTCALL, "add64(buf, off, delta) -> new value"},
    {"write_eof", (PyCFunction)(void (*)(void))py_write_eof, METH_FASTCALL, "write_eof(buf, from_pos, align, name=None) -> pos"},
    {"scan", (PyCFunction)(void (*)(void))py_scan, METH_VARARGS | METH_KEYWORDS, "batch header scan"},
    {"gather", (PyCFunction)py_gather, METH_VARARGS, "copy bodies into one buffer + int32 offsets"},
    {"index_array", (PyCFunction)py_index_array, METH_VARARGS, "locate an index document's int64 array"},
    {"check_run", (PyCFunction)py_check_run, METH_VARARGS, "check a replication run's documents"},
    {"read_run", (PyCFunction)py_read_run, METH_VARARGS, "copy a run of documents from a tailer"},
    {"read_runs", (PyCFunction)py_read_runs, METH_VARARGS, "copy runs of documents into datagram-sized slots"},
    {"write_run", (PyCFunction)py_write_run, METH_VARARGS, "append a run of documents through an appender"},
    {"read_payloads", (PyCFunction)(void (*)(void))py_read_payloads, METH_FASTCALL, read_payloads_doc},
    DOORBELL_METHODS /* doorbell */
    {NULL}};

static struct PyModuleDef native_module = {PyModuleDef_HEAD_INIT, "chronq._native",
                                           "chronq's native hot path (private; see _native.pyi).", -1, module_methods,
                                           NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&MapType) < 0 || PyType_Ready(&GeometryType) < 0 || PyType_Ready(&AppenderType) < 0 ||
        PyType_Ready(&ExcerptType) < 0 || PyType_Ready(&TailerType) < 0)
        return NULL;
    if (PyType_Ready(&MergeType) < 0 || PyType_Ready(&DoorbellNotifierType) < 0) return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Map", (PyObject *)&MapType) < 0 ||
        PyModule_AddObjectRef(m, "Geometry", (PyObject *)&GeometryType) < 0 ||
        PyModule_AddObjectRef(m, "AppenderCore", (PyObject *)&AppenderType) < 0 ||
        PyModule_AddObjectRef(m, "Excerpt", (PyObject *)&ExcerptType) < 0 ||
        PyModule_AddObjectRef(m, "TailerCore", (PyObject *)&TailerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Merge", (PyObject *)&MergeType) < 0 ||
        PyModule_AddObjectRef(m, "DoorbellNotifier", (PyObject *)&DoorbellNotifierType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *source = PyCapsule_New(&tailer_document_source, DOCUMENT_SOURCE_CAPSULE, NULL);
    if (!source || PyModule_AddObject(m, "DOCUMENT_SOURCE", source) < 0) {
        Py_XDECREF(source);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *unl = PyLong_FromLongLong(LOCK_UNLOCKED);
    if (!unl || PyModule_AddObject(m, "UNLOCKED", unl) < 0) {
        Py_XDECREF(unl);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
