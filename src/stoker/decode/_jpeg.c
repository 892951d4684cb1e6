/*
 * stoker.decode._jpeg -- decode only a window of a JPEG with libjpeg-turbo.
 *
 * Two functions, both built on the Python C API alone (no numpy headers):
 *
 *   header(data) -> (height, width, components, colorspace, warnings, warning)
 *   decode_region(data, top, left, height, width, scale_denom, fast, out[, channels])
 *       -> (out_h, out_w, skip, pitch, warnings, warning)
 *
 * decode_region() decodes the rows and columns that the region needs and no
 * more: jpeg_crop_scanline() limits the columns, jpeg_skip_scanlines() jumps
 * over the rows above and the rows below are never decoded (the decompressor
 * is destroyed as soon as the last wanted row is out).  Pixels are written as
 * RGB rows (``channels`` 3) or grayscale rows (``channels`` 1: libjpeg's
 * JCS_GRAYSCALE output, which for a YCbCr file is the Y plane as decoded, with
 * no chroma IDCT, upsampling or colour conversion; an RGB file's gray is
 * libjpeg's luma of it) of ``pitch`` pixels straight into the caller's writable buffer
 * ``out``; the window is columns skip .. skip + out_w of each row (libjpeg
 * decodes from an iMCU boundary, at most 33 pixels left of the window, so
 * ``pitch`` <= out_w + 34).  The caller views the window in place: no row is
 * copied.  All libjpeg work runs with the GIL released.
 *
 * Region mapping (region in full-resolution, stored -- not EXIF-rotated --
 * pixel coordinates; s = scale_denom in {1, 2, 4, 8}; H, W = image size):
 *
 *   scaled image  Hs = ceil(H / s),  Ws = ceil(W / s)   (libjpeg's own sizes)
 *   y0 = floor(top / s),   y1 = min(ceil((top + height) / s), Hs)
 *   x0 = floor(left / s),  x1 = min(ceil((left + width) / s), Ws)
 *   out_h = y1 - y0,  out_w = x1 - x0
 *
 * i.e. the smallest window of the scaled image that covers the region.
 * stoker.decode.jpegcrop.scaled_region() mirrors this exactly.
 *
 * Exactness: jpeg_crop_scanline() moves the left edge down to an iMCU boundary
 * and "fancy" h2v1/h2v2 chroma upsampling treats the edges of the cropped
 * window as image edges, so the outermost column on either side of the window
 * may differ from a full decode.  We therefore ask libjpeg for one extra
 * column on each side (where the image has one) and copy out only the wanted
 * columns, so the result equals the same window of a full decode made with the
 * same library and settings.
 *
 * Errors and warnings: a libjpeg error raises ValueError carrying libjpeg's
 * message.  A libjpeg *warning* (recoverable corrupt data: extraneous bytes
 * before a marker, a bad ICC or Adobe segment, a bad Huffman code...) does not
 * stop the decode, as it does not in Pillow or OpenCV: the number of warnings
 * and the first one's message come back with the result, for the caller to
 * report.  The one warning that is an error is "premature end of JPEG file"
 * (JWRN_JPEG_EOF): the rows the caller asked for are not in the data, so it
 * raises ValueError whose message starts "truncated".
 * CMYK / YCCK images are refused with a ValueError that says "cmyk" (the caller
 * falls back to another decoder).  Progressive files with more than MAX_SCANS
 * scans are refused (a known denial-of-service pattern).  Out of memory raises
 * MemoryError.  Rows below the window are not decoded, so damage there (e.g. a
 * baseline file truncated below the window) goes unnoticed -- the pixels
 * returned are still exactly the file's pixels.
 *
 * Nothing is allocated from the image dimensions before the caller has had
 * the chance to check them with header(): header() only parses markers.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

/* Progressive files with more scans than this are refused (libjpeg-turbo's
 * own tools use a similar limit against scan-flooding inputs). */
#define MAX_SCANS 500

/* Rows asked of jpeg_read_scanlines at once (libjpeg recommends 1, 2 or 4). */
#define MAX_ROWS_PER_CALL 4

enum status {
    ST_OK = 0,
    ST_LIBJPEG, /* libjpeg error (or the truncation warning); message in job->msg */
    ST_NOMEM,   /* libjpeg ran out of memory */
    ST_CMYK,    /* CMYK or YCCK input, refused */
    ST_REGION,  /* region outside the image; message in job->msg */
    ST_OUTBUF,  /* output buffer too small; message in job->msg */
};

typedef struct {
    struct jpeg_error_mgr pub; /* must be first: libjpeg casts to it */
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX + 64];
    char warning[JMSG_LENGTH_MAX]; /* the first warning's message */
    int warnings;                  /* warnings seen */
    int nomem;
    int truncated;
} error_mgr;

/* Everything that must survive a longjmp lives here, in memory reached only
 * through a pointer that never changes after setjmp(). */
typedef struct {
    struct jpeg_decompress_struct cinfo;
    error_mgr err;
    struct jpeg_progress_mgr progress;
    /* input */
    const JOCTET *src;
    size_t src_len;
    /* decode_region parameters */
    Py_ssize_t top, left, height, width;
    int denom, fast, channels;
    unsigned char *out;
    Py_ssize_t out_len;
    /* results */
    JDIMENSION img_h, img_w, out_h, out_w;
    JDIMENSION skip, pitch; /* the window starts `skip` pixels into rows of `pitch` */
    int components, colorspace;
} job_t;

/* ------------------------------------------------------------ error manager */

static void
on_error_exit(j_common_ptr cinfo)
{
    error_mgr *err = (error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->msg);
    err->nomem = (cinfo->err->msg_code == JERR_OUT_OF_MEMORY);
    longjmp(err->jump, 1);
}

static void
on_emit_message(j_common_ptr cinfo, int msg_level)
{
    /* msg_level < 0 is a warning: recoverable corrupt data, counted and the
     * first kept; trace messages (>= 0) are ignored.  Premature end of the
     * data is truncation, an error. */
    error_mgr *err = (error_mgr *)cinfo->err;

    if (msg_level >= 0)
        return;
    if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
        err->truncated = 1;
        on_error_exit(cinfo);
    }
    if (err->warnings++ == 0)
        (*cinfo->err->format_message)(cinfo, err->warning);
}

static void
on_output_message(j_common_ptr cinfo)
{
    (void)cinfo; /* never print to stderr */
}

static void
on_progress(j_common_ptr cinfo)
{
    j_decompress_ptr dinfo = (j_decompress_ptr)cinfo;
    error_mgr *err = (error_mgr *)cinfo->err;

    if (dinfo->input_scan_number > MAX_SCANS) {
        snprintf(err->msg, sizeof(err->msg),
                 "progressive JPEG has more than %d scans", MAX_SCANS);
        err->nomem = 0;
        longjmp(err->jump, 1);
    }
}

/* Set up cinfo (error manager, progress monitor, memory source) and read the
 * header.  Must be called after setjmp(job->err.jump). */
static void
open_and_read_header(job_t *job)
{
    j_decompress_ptr cinfo = &job->cinfo;

    jpeg_create_decompress(cinfo);
    job->progress.progress_monitor = on_progress;
    cinfo->progress = &job->progress;
    jpeg_mem_src(cinfo, job->src, (unsigned long)job->src_len);
    jpeg_read_header(cinfo, TRUE);
    job->img_h = cinfo->image_height;
    job->img_w = cinfo->image_width;
    job->components = cinfo->num_components;
    job->colorspace = (int)cinfo->jpeg_color_space;
}

static void
init_error_mgr(job_t *job)
{
    job->cinfo.err = jpeg_std_error(&job->err.pub);
    job->err.pub.error_exit = on_error_exit;
    job->err.pub.emit_message = on_emit_message;
    job->err.pub.output_message = on_output_message;
    job->err.msg[0] = '\0';
    job->err.warning[0] = '\0';
    job->err.warnings = 0;
    job->err.nomem = 0;
    job->err.truncated = 0;
}

/* ------------------------------------------------------------ the work (no GIL) */

static int
run_header(job_t *job)
{
    init_error_mgr(job);
    if (setjmp(job->err.jump)) {
        jpeg_destroy_decompress(&job->cinfo);
        return job->err.nomem ? ST_NOMEM : ST_LIBJPEG;
    }
    open_and_read_header(job);
    jpeg_destroy_decompress(&job->cinfo);
    return ST_OK;
}

static JDIMENSION
ceil_div(unsigned long long a, unsigned long long b)
{
    return (JDIMENSION)((a + b - 1) / b);
}

static int
run_decode(job_t *job)
{
    j_decompress_ptr cinfo = &job->cinfo;
    unsigned long long s, top, left, bottom, right;
    JDIMENSION y0, y1, x0, x1, crop_x, crop_w, row;
    JSAMPROW rows[MAX_ROWS_PER_CALL];
    JDIMENSION want, n, i, got;
    size_t row_bytes;

    init_error_mgr(job);
    if (setjmp(job->err.jump)) {
        /* Every libjpeg failure lands here: free everything, decode nothing
         * more.  Only `job` (unchanged since setjmp) is used. */
        jpeg_destroy_decompress(&job->cinfo);
        return job->err.nomem ? ST_NOMEM : ST_LIBJPEG;
    }
    open_and_read_header(job);

    if (cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(cinfo);
        return ST_CMYK;
    }

    top = (unsigned long long)job->top;
    left = (unsigned long long)job->left;
    bottom = top + (unsigned long long)job->height;
    right = left + (unsigned long long)job->width;
    if (bottom > cinfo->image_height || right > cinfo->image_width) {
        snprintf(job->err.msg, sizeof(job->err.msg),
                 "region (top=%zd, left=%zd, height=%zd, width=%zd) exceeds the "
                 "image size %ux%u", job->top, job->left, job->height, job->width,
                 (unsigned)cinfo->image_height, (unsigned)cinfo->image_width);
        jpeg_destroy_decompress(cinfo);
        return ST_REGION;
    }

    cinfo->out_color_space = job->channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    cinfo->scale_num = 1;
    cinfo->scale_denom = (unsigned int)job->denom;
    cinfo->dct_method = job->fast ? JDCT_IFAST : JDCT_ISLOW;
    cinfo->do_fancy_upsampling = job->fast ? FALSE : TRUE;
    jpeg_calc_output_dimensions(cinfo); /* output_height/width = ceil(H/s), ceil(W/s) */

    s = (unsigned long long)job->denom;
    y0 = (JDIMENSION)(top / s);
    x0 = (JDIMENSION)(left / s);
    y1 = ceil_div(bottom, s);
    x1 = ceil_div(right, s);
    if (y1 > cinfo->output_height)
        y1 = cinfo->output_height;
    if (x1 > cinfo->output_width)
        x1 = cinfo->output_width;
    job->out_h = y1 - y0;
    job->out_w = x1 - x0;

    jpeg_start_decompress(cinfo); /* reads all scans of a progressive file */
    if (cinfo->output_components != job->channels)
        ERREXIT(cinfo, JERR_BAD_STATE); /* cannot happen for JCS_RGB / JCS_GRAYSCALE */

    /* One spare column each side (see the exactness note above); libjpeg then
     * moves crop_x left to an iMCU boundary and widens crop_w to match. */
    crop_x = x0 > 0 ? x0 - 1 : 0;
    crop_w = (x1 < cinfo->output_width ? x1 + 1 : x1) - crop_x;
    jpeg_crop_scanline(cinfo, &crop_x, &crop_w); /* no-op for the full width */

    /* Rows go straight into `out`, crop_w pixels each; the caller views the wanted
     * columns (x0 - crop_x on) without copying them out of a row buffer. */
    job->skip = x0 - crop_x;
    job->pitch = crop_w;
    row_bytes = (size_t)crop_w * (size_t)job->channels;
    if ((unsigned long long)job->out_h * row_bytes > (unsigned long long)job->out_len) {
        snprintf(job->err.msg, sizeof(job->err.msg),
                 "output buffer holds %zd bytes, the region needs %u rows of %u x %d",
                 job->out_len, (unsigned)job->out_h, (unsigned)crop_w, job->channels);
        jpeg_destroy_decompress(cinfo);
        return ST_OUTBUF;
    }

    if (y0 > 0 && jpeg_skip_scanlines(cinfo, y0) != y0)
        ERREXIT(cinfo, JERR_BAD_STATE);

    /* As many rows per call as libjpeg recommends: with plain upsampling (fast) its merged
     * upsampler makes 2 rows at a time and would otherwise copy every other row out of a
     * spare buffer. */
    want = cinfo->rec_outbuf_height;
    if (want < 1)
        want = 1;
    if (want > MAX_ROWS_PER_CALL)
        want = MAX_ROWS_PER_CALL;
    for (row = 0; row < job->out_h; row += got) {
        n = job->out_h - row < want ? job->out_h - row : want;
        for (i = 0; i < n; i++)
            rows[i] = job->out + (size_t)(row + i) * row_bytes;
        got = jpeg_read_scanlines(cinfo, rows, n);
        if (got == 0)
            ERREXIT(cinfo, JERR_INPUT_EOF);
    }

    /* The rows below are never decoded. */
    jpeg_destroy_decompress(cinfo);
    return ST_OK;
}

/* ------------------------------------------------------------ Python glue */

static PyObject *
raise_status(int status, job_t *job)
{
    switch (status) {
    case ST_NOMEM:
        return PyErr_Format(PyExc_MemoryError, "libjpeg: %s", job->err.msg);
    case ST_CMYK:
        return PyErr_Format(PyExc_ValueError,
                            "cmyk/ycck JPEG is not supported by stoker.decode._jpeg "
                            "(jpeg colorspace %d)", job->colorspace);
    case ST_REGION:
    case ST_OUTBUF:
        return PyErr_Format(PyExc_ValueError, "%s", job->err.msg);
    default:
        if (job->err.truncated)
            return PyErr_Format(PyExc_ValueError, "truncated JPEG: %s", job->err.msg);
        return PyErr_Format(PyExc_ValueError, "corrupt or unsupported JPEG: %s",
                            job->err.msg);
    }
}

PyDoc_STRVAR(header_doc,
"header(data) -> (height, width, components, colorspace, warnings, warning)\n"
"\n"
"Parse the JPEG markers of ``data`` (any bytes-like object) up to the first\n"
"scan and return the full-resolution stored size (no EXIF rotation), the\n"
"number of components and libjpeg's J_COLOR_SPACE of the file\n"
"(1 grayscale, 2 RGB, 3 YCbCr, 4 CMYK, 5 YCCK, 0 unknown), then the number of\n"
"libjpeg warnings (recoverable corrupt data) and the first one's message.\n"
"Decodes no pixels and allocates nothing that depends on the image size.\n"
"Raises ValueError for data that is not a readable JPEG header.");

static PyObject *
jpeg_header(PyObject *module, PyObject *arg)
{
    Py_buffer data;
    job_t job;
    int status;

    (void)module;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0)
        return NULL;
    memset(&job, 0, sizeof(job));
    job.src = (const JOCTET *)data.buf;
    job.src_len = (size_t)data.len;

    Py_BEGIN_ALLOW_THREADS
    status = run_header(&job);
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&data);
    if (status != ST_OK)
        return raise_status(status, &job);
    return Py_BuildValue("(IIiiis)", (unsigned)job.img_h, (unsigned)job.img_w,
                         job.components, job.colorspace, job.err.warnings,
                         job.err.warning);
}

PyDoc_STRVAR(decode_region_doc,
"decode_region(data, top, left, height, width, scale_denom, fast, out,\n"
"              channels=3) -> (out_h, out_w, skip, pitch, warnings, warning)\n"
"\n"
"Decode the region (top, left, height, width) -- full-resolution stored\n"
"coordinates -- of the JPEG ``data`` at scale 1/scale_denom (1, 2, 4 or 8)\n"
"as out_h rows of ``pitch`` pixels into ``out``: RGB for channels=3,\n"
"grayscale (libjpeg's JCS_GRAYSCALE: the Y plane of a YCbCr file) for\n"
"channels=1. ``out`` is a writable C-contiguous buffer of at least\n"
"out_h * (out_w + 34) * channels bytes; the region is columns\n"
"skip .. skip + out_w of each row. With s = scale_denom and the scaled\n"
"image ceil(H/s) x ceil(W/s):\n"
"\n"
"    y0 = top // s,   y1 = min(ceil((top + height) / s), ceil(H / s))\n"
"    x0 = left // s,  x1 = min(ceil((left + width) / s), ceil(W / s))\n"
"    out_h = y1 - y0, out_w = x1 - x0\n"
"\n"
"Only the rows and columns the region needs are decoded. ``fast`` selects\n"
"the fast integer IDCT and plain (non-fancy) upsampling. The GIL is released\n"
"while decoding.\n"
"\n"
"``warnings`` counts libjpeg's warnings (recoverable corrupt data, decoded\n"
"anyway) and ``warning`` is the first one's message ('' when none).\n"
"Raises ValueError for corrupt or truncated data (the message of the latter\n"
"starts 'truncated'), for a region outside the image, for a too-small ``out``, and for\n"
"CMYK/YCCK images (the message says 'cmyk'); MemoryError if libjpeg runs\n"
"out of memory.");

static PyObject *
jpeg_decode_region(PyObject *module, PyObject *args)
{
    Py_buffer data, out;
    Py_ssize_t top, left, height, width;
    int denom, fast, status, channels = 3;
    job_t job;

    (void)module;
    if (!PyArg_ParseTuple(args, "y*nnnnipw*|i:decode_region", &data, &top, &left,
                          &height, &width, &denom, &fast, &out, &channels))
        return NULL;
    if (channels != 1 && channels != 3) {
        PyErr_Format(PyExc_ValueError, "channels must be 1 or 3, not %d", channels);
        goto fail;
    }
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8) {
        PyErr_Format(PyExc_ValueError, "scale_denom must be 1, 2, 4 or 8, not %d", denom);
        goto fail;
    }
    if (top < 0 || left < 0 || height <= 0 || width <= 0 ||
        top > (Py_ssize_t)UINT_MAX || left > (Py_ssize_t)UINT_MAX ||
        height > (Py_ssize_t)UINT_MAX || width > (Py_ssize_t)UINT_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "region (top=%zd, left=%zd, height=%zd, width=%zd) needs "
                     "top, left >= 0 and height, width > 0", top, left, height, width);
        goto fail;
    }

    memset(&job, 0, sizeof(job));
    job.src = (const JOCTET *)data.buf;
    job.src_len = (size_t)data.len;
    job.top = top;
    job.left = left;
    job.height = height;
    job.width = width;
    job.denom = denom;
    job.fast = fast;
    job.channels = channels;
    job.out = (unsigned char *)out.buf;
    job.out_len = out.len;

    Py_BEGIN_ALLOW_THREADS
    status = run_decode(&job);
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (status != ST_OK)
        return raise_status(status, &job);
    return Py_BuildValue("(IIIIis)", (unsigned)job.out_h, (unsigned)job.out_w,
                         (unsigned)job.skip, (unsigned)job.pitch, job.err.warnings,
                         job.err.warning);

fail:
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return NULL;
}

static PyMethodDef jpeg_methods[] = {
    {"header", jpeg_header, METH_O, header_doc},
    {"decode_region", jpeg_decode_region, METH_VARARGS, decode_region_doc},
    {NULL, NULL, 0, NULL},
};

/* Bumped whenever a function's arguments or results change: the Python side refuses a build
 * of another version (an editable install not rebuilt after a pull) instead of failing on
 * every image. Keep equal to API_VERSION in jpegcrop.py. */
#define STOKER_JPEG_API 2

static int
jpeg_exec(PyObject *module)
{
    if (PyModule_AddIntConstant(module, "API_VERSION", STOKER_JPEG_API) < 0)
        return -1;
#ifdef LIBJPEG_TURBO_VERSION
#define STOKER_STR2(x) #x
#define STOKER_STR(x) STOKER_STR2(x)
    if (PyModule_AddStringConstant(module, "LIBJPEG_TURBO_VERSION",
                                   STOKER_STR(LIBJPEG_TURBO_VERSION)) < 0)
        return -1;
#endif
    if (PyModule_AddIntConstant(module, "MAX_SCANS", MAX_SCANS) < 0 ||
        PyModule_AddIntConstant(module, "JCS_UNKNOWN", JCS_UNKNOWN) < 0 ||
        PyModule_AddIntConstant(module, "JCS_GRAYSCALE", JCS_GRAYSCALE) < 0 ||
        PyModule_AddIntConstant(module, "JCS_RGB", JCS_RGB) < 0 ||
        PyModule_AddIntConstant(module, "JCS_YCbCr", JCS_YCbCr) < 0 ||
        PyModule_AddIntConstant(module, "JCS_CMYK", JCS_CMYK) < 0 ||
        PyModule_AddIntConstant(module, "JCS_YCCK", JCS_YCCK) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot jpeg_slots[] = {
    {Py_mod_exec, jpeg_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_GIL_DISABLED
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef jpeg_module = {
    PyModuleDef_HEAD_INIT,
    "stoker.decode._jpeg",
    "Crop-window JPEG decoding with libjpeg-turbo (GIL released). "
    "Use it through stoker.decode.jpegcrop.",
    0,
    jpeg_methods,
    jpeg_slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__jpeg(void)
{
    return PyModuleDef_Init(&jpeg_module);
}
