/*
 * pyerr.h: holding a raised exception aside while cleanup code runs, and taking it as an object.
 * Shared by chronq._native (chronq/csrc) and chronq._codecs; header only, nothing to link.
 *
 * Sections: SavedError (put the current exception aside, put it back); take_error (the current
 * exception as an object). Python 3.12+ keeps an exception as one object (PyErr_GetRaisedException);
 * older ones as (type, value, traceback), fetched, normalized and put back here.
 */
#ifndef CHRONQ_PYERR_H
#define CHRONQ_PYERR_H

#include <Python.h>

/* ------------------------------------------------------------------ SavedError */

/* The exception being raised, put aside (the error indicator cleared) so that calls that may raise can
 * run, then put back with saved_error_restore. */
typedef struct {
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc;
#else
    PyObject *type, *value, *tb;
#endif
} SavedError;

static inline void saved_error_take(SavedError *s) {
#if PY_VERSION_HEX >= 0x030C0000
    s->exc = PyErr_GetRaisedException();
#else
    PyErr_Fetch(&s->type, &s->value, &s->tb);
#endif
}

/* whether an exception was put aside */
static inline int saved_error_set(const SavedError *s) {
#if PY_VERSION_HEX >= 0x030C0000
    return s->exc != NULL;
#else
    return s->type != NULL;
#endif
}

/* makes the saved exception (if any) the one being raised again, replacing any raised since */
static inline void saved_error_restore(SavedError *s) {
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(s->exc);
    s->exc = NULL;
#else
    PyErr_Restore(s->type, s->value, s->tb);
    s->type = s->value = s->tb = NULL;
#endif
}

/* ------------------------------------------------------------------ take_error */

/* The exception being raised as an object, its traceback attached, the error indicator cleared: a new
 * reference (None if nothing was raised). */
static inline PyObject *take_error(void) {
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *value = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb && value) PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
#endif
    return value ? value : Py_NewRef(Py_None);
}

#endif
