/* stoker.sources._readfiles: file reads (whole files, or byte ranges of shards) run ahead of
 * decoding on native threads.
 *
 * The read-ahead window (readahead.py) keeps a few upcoming samples' reads in flight while
 * the worker decodes. On Python threads each read costs a wake-up, the GIL and a future; on
 * two busy cores that made every decode 15-30 % slower. Here the reads run on POSIX threads
 * that never touch the interpreter: open (non-blocking, so a FIFO never hangs), fstat (only
 * regular files are read), pread to the end, optionally O_DIRECT (around the page cache) or
 * posix_fadvise(DONTNEED) after, close. The caller takes each result by its tag, the wait
 * releasing the GIL, with a deadline; a read past it is abandoned (freed when it ends) and
 * another thread takes the place of the stuck one.
 *
 * Reader(threads, direct, drop); submit(tag, path[, offset, length, fd]: a byte range, as a
 * shard's image, through a descriptor the read takes over); take(tag, timeout) -> (bytes,
 * seconds) (a range: fewer bytes at the file's end), or (errno, st_mode, seconds) on failure
 * (st_mode != 0: not a regular file), or None past the deadline; discard() abandons every read
 * not taken; set_mode(direct, drop); pending(); threads().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ALIGN 4096
#define MAX_EXTRA_THREADS 32 /* threads started in place of ones stuck on dead files */
#define PER_THREAD 1         /* queued reads left to each awake thread */
#define NUDGE_S 0.002        /* a waited-for read not started after this: add a thread */

enum { QUEUED, RUNNING, DONE };

typedef struct job {
    long long tag;
    char *path;
    long long offset; /* a byte range of the file (offset >= 0, length), or the whole file (-1) */
    int fd;           /* a descriptor handed over with a range (shares its file's kernel
                       * readahead state, as a shard's own descriptor does), or -1 */
    size_t length, skip; /* skip: bytes of buf before the range (O_DIRECT reads whole blocks) */
    int state, abandoned, counted, direct, drop; /* counted: in shared_t.stuck */
    int refused;      /* O_DIRECT asked for, refused by the file system: read cached */
    int err;          /* errno of the failed call, 0 on success */
    unsigned mode;    /* st_mode of a file that is not regular (err = EINVAL) */
    char *buf;
    size_t len;
    double seconds;   /* how long the read took on its thread */
    struct job *next; /* queue order (QUEUED) */
    struct job *prev_all, *next_all; /* every job not yet taken or freed */
} job_t;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    job_t *head, *tail; /* queued, FIFO */
    job_t *all;         /* not yet taken (queued, running, done) */
    int refs;           /* the Reader object + each live thread */
    int live, idle, queued, stuck, stop;
    long refused; /* reads that asked for O_DIRECT and were refused it */
    pid_t pid;
} shared_t;

typedef struct {
    PyObject_HEAD
    shared_t *s;
    int threads, direct, drop;
} Reader;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void job_free(job_t *j) {
    if (j->fd >= 0) close(j->fd);
    free(j->path);
    free(j->buf);
    free(j);
}

static void unlink_all(shared_t *s, job_t *j) {
    if (j->prev_all) j->prev_all->next_all = j->next_all;
    else s->all = j->next_all;
    if (j->next_all) j->next_all->prev_all = j->prev_all;
    j->prev_all = j->next_all = NULL;
}

static void release(shared_t *s) { /* called with s->mu held; unlocks it */
    int last = --s->refs == 0;
    pthread_mutex_unlock(&s->mu);
    if (!last) return;
    job_t *j = s->all;
    while (j) { job_t *n = j->next_all; job_free(j); j = n; }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->done);
    free(s);
}

/* pread into buf[*done, want) from file offset at + *done, until `enough` bytes are in (O_DIRECT
 * reads whole blocks: a read after a short one would start off a block) or the end of the
 * file (then *done < want); 0, or the errno of a failed read. */
static int fill(int fd, char *buf, size_t want, off_t at, size_t *done, size_t enough) {
    while (*done < want && *done < enough) {
        ssize_t got = pread(fd, buf + *done, want - *done, at + (off_t)*done);
        if (got < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (got == 0) break;
        *done += (size_t)got;
    }
    return 0;
}

/* Read the open regular file fd to its end into j->buf (aligned for O_DIRECT). */
static int read_to_end(job_t *j, int fd, size_t size) {
    size_t cap = size + (j->direct ? 0 : 1); /* cached: one byte more shows a grown file */
    cap = (cap + ALIGN - 1) / ALIGN * ALIGN;
    if (cap == 0) cap = ALIGN;
    void *buf = NULL;
    if (posix_memalign(&buf, ALIGN, cap) != 0) return ENOMEM;
    size_t done = 0;
    for (;;) {
        int e = fill(fd, buf, cap, 0, &done, j->direct ? size : cap);
        if (e) { free(buf); return e; }
        if (done < cap || j->direct) break; /* O_DIRECT: a grown file is read as it was */
        void *bigger = realloc(buf, cap * 2);
        if (!bigger) { free(buf); return ENOMEM; }
        buf = bigger;
        cap *= 2;
    }
    if (j->direct && done > size) done = size; /* the block's tail past the end of file */
    j->buf = buf;
    j->len = done;
    return 0;
}

/* Read j->length bytes at j->offset of the open regular file fd (fewer at its end). */
static int read_range(job_t *j, int fd) {
    off_t start = (off_t)j->offset;
    size_t want = j->length;
    if (j->direct) { /* whole blocks around the range */
        start = (off_t)(j->offset / ALIGN * ALIGN);
        j->skip = (size_t)(j->offset - start);
        want = (j->skip + j->length + ALIGN - 1) / ALIGN * ALIGN;
    }
    void *buf = NULL;
    if (posix_memalign(&buf, ALIGN, want ? want : ALIGN) != 0) return ENOMEM;
    size_t done = 0;
    int e = fill(fd, buf, want, start, &done, j->skip + j->length);
    if (e) { free(buf); return e; }
    size_t have = done > j->skip ? done - j->skip : 0;
    j->buf = buf;
    j->len = have < j->length ? have : j->length; /* short: the caller reports it */
    return 0;
}

static int read_job(job_t *j, int fd, size_t size) {
    return j->offset >= 0 ? read_range(j, fd) : read_to_end(j, fd, size);
}

static int open_cached(job_t *j) { /* O_DIRECT refused: read this file the cached way */
    j->direct = 0;
    j->refused = 1;
    return open(j->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
}

static void run_job(job_t *j) {
    double t0 = now_s();
    int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC;
#ifdef O_DIRECT
    if (j->direct) flags |= O_DIRECT;
#else
    j->direct = 0;
#endif
    int fd;
    if (j->fd >= 0 && !j->direct) { /* the caller's descriptor: its readahead state kept */
        fd = j->fd;
        j->fd = -1;
    } else {
        fd = open(j->path, flags);
    }
    if (fd < 0 && errno == EINVAL && j->direct) fd = open_cached(j); /* refused at open */
    if (fd < 0) { j->err = errno; goto out; }
    struct stat st;
    if (fstat(fd, &st) != 0) { j->err = errno; close(fd); goto out; }
    if (!S_ISREG(st.st_mode)) { j->err = EINVAL; j->mode = st.st_mode; close(fd); goto out; }
    j->err = read_job(j, fd, (size_t)st.st_size);
#ifdef O_DIRECT
    if (j->err == EINVAL && j->direct) { /* refused at the read */
        close(fd);
        fd = open_cached(j);
        if (fd < 0) { j->err = errno; goto out; }
        j->skip = 0;
        j->err = read_job(j, fd, (size_t)st.st_size);
    }
#endif
#ifdef POSIX_FADV_DONTNEED
    if (j->err == 0 && (j->drop || j->direct)) /* direct: pages cached before this read */
        posix_fadvise(fd, j->offset >= 0 ? (off_t)j->offset : 0,
                      j->offset >= 0 ? (off_t)j->length : 0, POSIX_FADV_DONTNEED);
#endif
    close(fd);
out:
    j->seconds = now_s() - t0;
}

static void *serve(void *arg) {
    shared_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) {
            s->idle++;
            pthread_cond_wait(&s->work, &s->mu);
            s->idle--;
        }
        if (s->stop) break;
        job_t *j = s->head;
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        s->queued--;
        if (j->abandoned) { job_free(j); continue; } /* its caller gave up before it started */
        j->state = RUNNING;
        pthread_mutex_unlock(&s->mu);
        run_job(j);
        pthread_mutex_lock(&s->mu);
        j->state = DONE;
        s->refused += j->refused;
        if (j->abandoned) {
            if (j->counted) s->stuck--;
            job_free(j);
        } else {
            pthread_cond_broadcast(&s->done);
        }
    }
    s->live--;
    release(s);
    return NULL;
}

static int spawn(shared_t *s) { /* with s->mu held */
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    int rc = pthread_create(&t, &attr, serve, s);
    pthread_attr_destroy(&attr);
    if (rc == 0) { s->live++; s->refs++; }
    return rc;
}

static int add_thread(shared_t *s, int threads) { /* with s->mu held: wake one, or start one */
    if (s->idle) {
        pthread_cond_signal(&s->work);
        return 0;
    }
    if (s->live - s->stuck < threads && s->stuck <= MAX_EXTRA_THREADS) return spawn(s);
    return 0;
}

static int forked(Reader *self) {
    if (self->s->pid == getpid()) return 0;
    PyErr_SetString(PyExc_RuntimeError, "a Reader cannot be used after fork; make a new one");
    return 1;
}

static job_t *find(shared_t *s, long long tag) {
    for (job_t *j = s->all; j; j = j->next_all)
        if (j->tag == tag && !j->abandoned) return j;
    return NULL;
}

static PyObject *Reader_submit(Reader *self, PyObject *args) {
    long long tag, offset = -1, length = 0;
    int fd = -1; /* handed over: closed here on failure, else by the read */
    PyObject *path_obj;
    if (!PyArg_ParseTuple(args, "LO&|LLi", &tag, PyUnicode_FSConverter, &path_obj, &offset,
                          &length, &fd)) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    if (offset >= 0 && length < 0) {
        if (fd >= 0) close(fd);
        Py_DECREF(path_obj);
        PyErr_SetString(PyExc_ValueError, "length must be >= 0");
        return NULL;
    }
    if (forked(self)) { if (fd >= 0) close(fd); Py_DECREF(path_obj); return NULL; }
    job_t *j = calloc(1, sizeof(job_t));
    char *path = j ? strdup(PyBytes_AS_STRING(path_obj)) : NULL;
    Py_DECREF(path_obj);
    if (!path) { if (fd >= 0) close(fd); free(j); return PyErr_NoMemory(); }
    j->fd = fd;
    j->tag = tag;
    j->path = path;
    j->offset = offset < 0 ? -1 : offset;
    j->length = (size_t)(offset < 0 ? 0 : length);
    j->direct = self->direct;
    j->drop = self->drop;
    shared_t *s = self->s;
    pthread_mutex_lock(&s->mu);
    j->next_all = s->all;
    if (s->all) s->all->prev_all = j;
    s->all = j;
    if (s->tail) s->tail->next = j; else s->head = j;
    s->tail = j;
    s->queued++;
    int rc = 0;
    /* Wake (or start) a thread only while more reads are queued than PER_THREAD per awake
     * thread: an awake thread takes the next queued read itself, and each wake-up costs the
     * decoding cores a context switch (take() adds one when the read it waits for has not
     * started: the threads are behind, or stuck). */
    if (s->queued > PER_THREAD * (s->live - s->idle - s->stuck)) rc = add_thread(s, self->threads);
    int none = s->live == 0;
    pthread_mutex_unlock(&s->mu);
    if (rc && none) { errno = rc; return PyErr_SetFromErrno(PyExc_OSError); }
    Py_RETURN_NONE;
}

static PyObject *Reader_take(Reader *self, PyObject *args) {
    long long tag;
    double timeout;
    if (!PyArg_ParseTuple(args, "Ld", &tag, &timeout)) return NULL;
    if (forked(self)) return NULL;
    shared_t *s = self->s;
    job_t *j;
    int found = 1, late = 0;
    double deadline = now_s() + timeout;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&s->mu);
    j = find(s, tag);
    if (!j) found = 0;
    while (j && j->state != DONE) {
        double left = deadline - now_s();
        if (left <= 0) { late = 1; break; }
        if (j->state == QUEUED) { /* the threads are behind (or stuck): one more */
            add_thread(s, self->threads);
            if (left > NUDGE_S) left = NUDGE_S;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        double end = until.tv_sec + until.tv_nsec * 1e-9 + left;
        until.tv_sec = (time_t)end;
        until.tv_nsec = (long)((end - (double)until.tv_sec) * 1e9);
        pthread_cond_timedwait(&s->done, &s->mu, &until);
    }
    if (j) {
        unlink_all(s, j);
        if (late) {
            j->abandoned = 1; /* queued: its thread frees it unread... */
            if (j->state == RUNNING) { j->counted = 1; s->stuck++; } /* ...running: when done */
        }
    }
    pthread_mutex_unlock(&s->mu);
    Py_END_ALLOW_THREADS
    if (!found) return PyErr_Format(PyExc_KeyError, "no read submitted for %lld", tag);
    if (late) Py_RETURN_NONE;
    PyObject *out;
    if (j->err)
        out = Py_BuildValue("(iId)", j->err, j->mode, j->seconds);
    else
        out = Py_BuildValue("(y#d)", j->buf ? j->buf + j->skip : "", (Py_ssize_t)j->len,
                            j->seconds);
    job_free(j);
    return out;
}

static void abandon_all(shared_t *s) { /* with s->mu held: every job not taken */
    job_t *j = s->all;
    while (j) {
        job_t *n = j->next_all;
        unlink_all(s, j);
        if (j->state == DONE) job_free(j);
        else if (j->state == RUNNING) j->abandoned = 1; /* its thread frees it when done */
        j = n;
    }
    for (j = s->head; j;) { /* never started: freed unread */
        job_t *n = j->next;
        job_free(j);
        j = n;
    }
    s->head = s->tail = NULL;
    s->queued = 0;
}

static PyObject *Reader_discard(Reader *self, PyObject *Py_UNUSED(ignored)) {
    if (forked(self)) return NULL;
    pthread_mutex_lock(&self->s->mu);
    abandon_all(self->s);
    pthread_mutex_unlock(&self->s->mu);
    Py_RETURN_NONE;
}

static PyObject *Reader_set_mode(Reader *self, PyObject *args) {
    int direct, drop;
    if (!PyArg_ParseTuple(args, "pp", &direct, &drop)) return NULL;
    self->direct = direct;
    self->drop = drop;
    Py_RETURN_NONE;
}

static PyObject *Reader_pending(Reader *self, PyObject *Py_UNUSED(ignored)) {
    if (forked(self)) return NULL;
    long n = 0;
    pthread_mutex_lock(&self->s->mu);
    for (job_t *j = self->s->all; j; j = j->next_all) n++;
    pthread_mutex_unlock(&self->s->mu);
    return PyLong_FromLong(n);
}

static PyObject *Reader_threads(Reader *self, PyObject *Py_UNUSED(ignored)) {
    if (forked(self)) return NULL;
    pthread_mutex_lock(&self->s->mu);
    PyObject *out = Py_BuildValue("(iil)", self->s->live, self->s->stuck, self->s->refused);
    pthread_mutex_unlock(&self->s->mu);
    return out;
}

static int Reader_init(Reader *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"threads", "direct", "drop", NULL};
    int threads = 4, direct = 0, drop = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|ipp", names, &threads, &direct, &drop))
        return -1;
    if (threads < 1) { PyErr_SetString(PyExc_ValueError, "threads must be >= 1"); return -1; }
    if (self->s) { PyErr_SetString(PyExc_RuntimeError, "Reader already initialised"); return -1; }
    shared_t *s = calloc(1, sizeof(shared_t));
    if (!s) { PyErr_NoMemory(); return -1; }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->done, NULL);
    s->refs = 1;
    s->pid = getpid();
    self->s = s;
    self->threads = threads;
    self->direct = direct;
    self->drop = drop;
    return 0;
}

static void Reader_dealloc(Reader *self) {
    shared_t *s = self->s;
    if (s && s->pid == getpid()) { /* after fork the parent's lock may be held: leave it */
        pthread_mutex_lock(&s->mu);
        abandon_all(s);
        s->stop = 1;
        pthread_cond_broadcast(&s->work);
        release(s);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Reader_methods[] = {
    {"submit", (PyCFunction)Reader_submit, METH_VARARGS,
     "submit(tag, path[, offset, length, fd]): start reading the file (or that byte range;\n"
     "fd, a descriptor of it that the read takes over and closes)."},
    {"take", (PyCFunction)Reader_take, METH_VARARGS,
     "take(tag, timeout) -> (bytes, seconds), (errno, st_mode, seconds), or None if late."},
    {"discard", (PyCFunction)Reader_discard, METH_NOARGS, "Abandon every read not taken."},
    {"set_mode", (PyCFunction)Reader_set_mode, METH_VARARGS,
     "set_mode(direct, drop): how reads submitted from now on treat the page cache."},
    {"pending", (PyCFunction)Reader_pending, METH_NOARGS, "Reads submitted, not yet taken."},
    {"threads", (PyCFunction)Reader_threads, METH_NOARGS,
     "(live threads, stuck threads, reads refused O_DIRECT so far)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stoker.sources._readfiles.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "File reads on native threads, taken by tag (see the module docstring).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_readfiles",
    "File reads run ahead of decoding on native threads (stoker's read-ahead window).",
    -1, NULL,
};

#define STOKER_READFILES_API 1 /* keep equal to API_VERSION in sources/filereads.py */

PyMODINIT_FUNC PyInit__readfiles(void) {
    if (PyType_Ready(&ReaderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0 ||
        PyModule_AddIntConstant(m, "API_VERSION", STOKER_READFILES_API) < 0) {
        Py_DECREF(&ReaderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
