/* shmcache/_unpack.c: the compiled decoder of plain msgpack values, tuples, sets and the standard types. */
#ifndef SHMCACHE_UNPACK_H
#define SHMCACHE_UNPACK_H

#include <Python.h>

/* The value msgpack encoded in the n bytes at data (a new reference), or NULL with no exception set when it declines:
   anything it does not decode exactly as codec.py does (other ext types, damaged bytes...) is codec.py's. */
PyObject *shm_unpack(const char *data, Py_ssize_t n);

#endif
