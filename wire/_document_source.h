/*
 * The document-source protocol between a queue's tailer and wire._speedups.ReadOne (a method reader's
 * read_one()). A source exports this struct in a capsule named "wire._speedups.DocumentSource";
 * chronq's tailer does (chronq._native.DOCUMENT_SOURCE).
 *
 * read(source, &data, &len, &metadata) is the source's read() without a Python call, plus the
 * payload's address, length and metadata flag, so the reader neither asks the excerpt for them nor
 * exports its buffer. It returns a new reference to what keeps the data alive (the excerpt), None when
 * there is nothing to read yet, or NULL with an exception; *metadata is -1 when the returned object is
 * not a plain excerpt (the caller then asks it through Python). Version 2 adds *index, the document's
queue index (-1 when unknown: the caller asks the excerpt), so recording a hop costs no attribute lookup.
 */
#ifndef WIRE_DOCUMENT_SOURCE_H
#define WIRE_DOCUMENT_SOURCE_H

#include <stdint.h>

#define DOCUMENT_SOURCE_CAPSULE "wire._speedups.DocumentSource"
#define DOCUMENT_SOURCE_VERSION 2

typedef struct {
    int version;
    PyObject *(*read)(PyObject *source, const char **data, Py_ssize_t *len, int *metadata, int64_t *index);
} DocumentSource;

#endif
