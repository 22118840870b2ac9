/* channel_engine.log._batch_codec: Kafka record batch v2, uncompressed, in C.
 *
 * The hot paths' codec behind record_batch.build() (encode) and LogReader._decode
 * (decode): the format is record_batch.py's (its module doc has the offset table); this
 * module owns no format of its own and writes exactly the bytes aiokafka's
 * DefaultRecordBatchBuilder writes for the same events (compression none).
 *
 * encode(events, transaction_id, now) -> bytearray | None
 *     The batch record_batch.build(events, 0, transaction_id) gives, timestamps None
 *     taken as `now`. None when anything is not plainly well-formed or not of an exact
 *     built-in type (bytes, bytearray or memoryview for body, key and header values; str
 *     or None for header values; a dict of headers; a subclass may run Python code or
 *     define __bytes__), a bad timestamp, a str that is not UTF-8, a batch of 2 GiB or
 *     more, ...: the caller then runs the Python path, which encodes or raises
 *     InvalidEventError naming the event and field. Never raises for bad events. Two
 *     passes: the first pins every field (a reference or a held buffer) and sizes the
 *     records, the second writes them from the pinned fields only, bounds-checked.
 *
 * decode(batch, partition, start, stop, limit, out) -> bool
 *     Appends to the list `out` an Event (partition, offset, timestamp, key, headers
 *     dict, value or b"") per record with start <= offset < stop, returning once `out`
 *     holds `limit` events or a record at or past `stop` is met: the loop _decode runs
 *     over aiokafka's records, check for check. False (nothing appended) for what it does
 *     not handle: a compressed or sealed batch, bounds outside int64; the caller then runs
 *     aiokafka. A malformed records section raises aiokafka's CorruptRecordException (its
 *     messages) or UnicodeDecodeError (a header name): every length and every varint byte
 *     is checked against the end of the batch first. The Event, PendingEvent and error
 *     classes are imported with this module.
 *
 * plain_events(events) -> bool
 *     True when a list or tuple holds only PendingEvents (exact class) of a bytes body, a
 *     bytes or None key, no headers and no timestamp: record_batch.check_events's test
 *     for events a put takes as they are (the rest it checks one by one).
 *
 * events_from_texts(objects) -> list | None
 *     PendingEvent(text.encode()) for each object of a list that is exactly {"body":
 *     text} (exact dict and str): the produce endpoint's commonest event, parsed by
 *     orjson. None when any object is not (the caller reads them one by one).
 *
 * ColumnBuffers(readable=False): the Spark source's reader (spark/arrow_decode.py has the
 *   Arrow layout; readable: also tell text from bytes, see take()):
 *   .append(batch, expected, stop) -> (added, gap) | None
 *     Reads every record of a plain batch with decode's checks and errors (a malformed
 *     batch appends nothing: the buffers roll back) and appends those with expected <=
 *     offset < stop to growing Arrow buffers: no Python object per record. They must run
 *     expected, expected + 1, ...: gap is the first offset in range that broke the run
 *     (None when none did), added the records appended before it. Record offsets that do
 *     not increase from one record to the next are damage (CorruptRecordException, nothing
 *     appended), in or out of the range. None (nothing appended) for a compressed or
 *     sealed batch, or one shorter than its header: the caller decodes it with aiokafka.
 *     A failed allocation (MemoryError) appends nothing either.
 *     Headers as dict() leaves them (a repeated name keeps its first place and last
 *     value); names must be UTF-8 (UnicodeDecodeError, as decode); a null value is b"".
 *     OverflowError where a data buffer would pass the 2 GiB - 1 its int32 offsets
 *     address: the caller cuts its RecordBatches before (never reached there).
 *   .take() -> (rows, key nulls, header entries, header value nulls, raw keys, raw values,
 *               raw header values, 18 bytearrays)
 *     Hands the buffers over (pyarrow wraps them without a copy) and starts afresh (on
 *     MemoryError it keeps them, whole):
 *     offsets, timestamps (int64); key validity, key int32 ends, key data; value ends,
 *     value data; header int32 entry ends; name ends, name data; header value validity,
 *     value ends, value data; then, readable only (else empty, the raw counts 0), five
 *     bitmaps: text and raw of the key, text and raw of the value, raw of the header
 *     values. "text" is set where the bytes are well-formed UTF-8 (Unicode's Table 3-7:
 *     what Python's strict decoder and Spark's is_valid_utf8 accept), "raw" where they
 *     are not; a null key or header value is neither, a null value reads as b"" (text),
 *     as does an empty one. The raw counts are the bits set in the raw bitmaps. Every ends
 *     buffer begins with its 0; validity bitmaps are Arrow's (LSB first).
 *   len() is the rows held.
 *
 * Thread safety: all calls hold the GIL; no state but the imported classes, the header-name
 * hash's salt (set once at import) and each
 * ColumnBuffers' own (one per reader; a call made while another runs on the same object,
 * from a finalizer, raises RuntimeError).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEADER_SIZE 61
#define LOG_OVERHEAD 12
#define MAGIC 2
#define CRC_AT 17
#define CRC_START 21
#define ATTRIBUTES_AT 21
#define CODEC_MASK 0x07
#define TIMESTAMP_TYPE_MASK 0x08
#define TRANSACTIONAL_MASK 0x10
#define ENCRYPTED_MASK 0x80
#define MAX_BATCH 0x7FFFFFFF /* record_batch._MAX_BATCH: aiokafka drops records past it */

static PyObject *event_type;     /* channel_engine.event.Event, set at import */
static PyObject *pending_type;   /* channel_engine.event.PendingEvent, set at import */
static PyObject *corrupt_error;  /* aiokafka.errors.CorruptRecordException, set at import */

/* ---- CRC-32C (Castagnoli), reflected polynomial 0x82F63B78 --------------------------- */

static uint32_t crc_table[8][256];

static void crc_init_tables(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            crc_table[t][n] = (crc_table[t - 1][n] >> 8) ^ crc_table[0][crc_table[t - 1][n] & 0xFF];
}

/* Slice-by-8: where the CPU has no CRC-32C instruction. */
static uint32_t crc_software(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
        n--;
    }
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        word ^= crc; /* little-endian hosts only reach here (see crc32c below) */
        crc = crc_table[7][word & 0xFF] ^ crc_table[6][(word >> 8) & 0xFF]
            ^ crc_table[5][(word >> 16) & 0xFF] ^ crc_table[4][(word >> 24) & 0xFF]
            ^ crc_table[3][(word >> 32) & 0xFF] ^ crc_table[2][(word >> 40) & 0xFF]
            ^ crc_table[1][(word >> 48) & 0xFF] ^ crc_table[0][word >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

static uint32_t crc_bytewise(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_HW_CRC 1

/* SSE4.2's crc32 instruction, three independent streams so its 3-cycle latency overlaps;
   the streams are joined by running the first two over the zeros the others covered
   (crc_shift: multiply by x^(8*len) mod P, one bit at a time over a 32-bit operator). */
static uint32_t gf2_times(uint32_t a, uint32_t b)
{
    uint32_t product = 0;
    for (int i = 0; i < 32; i++) {
        product ^= (0u - ((b >> 31) & 1u)) & a;
        a = (a >> 1) ^ (0x82F63B78u & (0u - (a & 1u)));
        b <<= 1;
    }
    return product;
}

static uint32_t shift_operator[64]; /* x^(8 * 2^k) mod P, reflected */

static void crc_init_shift(void)
{
    uint32_t p = 0x40000000u; /* x^1 */
    for (int k = 0; k < 3; k++)
        p = gf2_times(p, p); /* x^8 */
    shift_operator[0] = p;
    for (int k = 1; k < 64; k++)
        shift_operator[k] = gf2_times(shift_operator[k - 1], shift_operator[k - 1]);
}

/* crc (a raw register value) extended over `n` zero bytes. */
static uint32_t crc_shift(uint32_t crc, size_t n)
{
    for (int k = 0; n; k++, n >>= 1)
        if (n & 1)
            crc = gf2_times(shift_operator[k], crc);
    return crc;
}

__attribute__((target("sse4.2")))
static uint32_t crc_hardware(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c0 = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        n--;
    }
    if (n >= 3 * 256) {
        size_t lane = (n / 24) * 8; /* bytes per stream, a multiple of 8 */
        const unsigned char *p1 = p + lane, *p2 = p + 2 * lane;
        uint64_t c1 = 0, c2 = 0, w0, w1, w2;
        for (size_t i = 0; i < lane; i += 8) {
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p1 + i, 8);
            memcpy(&w2, p2 + i, 8);
            c0 = _mm_crc32_u64(c0, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
        }
        c0 = crc_shift((uint32_t)c0, lane) ^ (uint32_t)c1;
        c0 = crc_shift((uint32_t)c0, lane) ^ (uint32_t)c2;
        p += 3 * lane;
        n -= 3 * lane;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c0 = _mm_crc32_u64(c0, w);
        p += 8;
        n -= 8;
    }
    while (n--)
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return ~(uint32_t)c0;
}
#endif

static uint32_t (*crc_impl)(uint32_t, const unsigned char *, size_t) = crc_bytewise;

static void crc_init(void)
{
    crc_init_tables();
#if PY_LITTLE_ENDIAN
    crc_impl = crc_software;
#endif
#ifdef HAVE_HW_CRC
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc_init_shift();
        crc_impl = crc_hardware;
    }
#endif
}

/* ---- big-endian fields and zig-zag varints --------------------------------------------- */

static void put_be16(unsigned char *p, uint16_t v) { p[0] = v >> 8; p[1] = (unsigned char)v; }

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = (unsigned char)v;
}

static void put_be64(unsigned char *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

static uint64_t get_be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t get_be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

static Py_ssize_t varint_size(int64_t v)
{
    uint64_t z = zigzag(v);
    Py_ssize_t n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static unsigned char *put_varint(unsigned char *p, int64_t v)
{
    uint64_t z = zigzag(v);
    while (z >= 0x80) {
        *p++ = (unsigned char)(z | 0x80);
        z >>= 7;
    }
    *p++ = (unsigned char)z;
    return p;
}

/* ---- encode ---------------------------------------------------------------------------- */

static int check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t expected)
{
    if (nargs == expected)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, expected, nargs);
    return 0;
}

/* The bytes of one field as the record stores them, pinned from pass 1 (sizing) to pass 2
   (writing): `owner` a strong reference to an immutable object (bytes, str and its UTF-8
   form), or `view` a held buffer (bytearray, memoryview: a held buffer cannot be resized or
   released). Python code may run between the passes (the batch's allocation can run a
   collection and its finalizers), so pass 2 reads only these, never the events again. */
typedef struct {
    PyObject *owner;
    Py_buffer view;   /* held when view.obj != NULL */
    const char *data;
    Py_ssize_t len;   /* -1: null */
} Field;

typedef struct {
    Field *items;
    Py_ssize_t count, allocated;
} Fields;

/* A new, empty field at the end; NULL when out of memory (raised). */
static Field *fields_add(Fields *fields)
{
    if (fields->count == fields->allocated) {
        Py_ssize_t allocated = fields->allocated ? fields->allocated * 2 : 64;
        Field *items = PyMem_Realloc(fields->items, (size_t)allocated * sizeof(Field));
        if (items == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        fields->items = items;
        fields->allocated = allocated;
    }
    Field *field = &fields->items[fields->count++];
    memset(field, 0, sizeof(Field));
    return field;
}

static void fields_release(Fields *fields)
{
    for (Py_ssize_t i = 0; i < fields->count; i++) {
        Field *field = &fields->items[i];
        Py_XDECREF(field->owner);
        if (field->view.obj != NULL)
            PyBuffer_Release(&field->view);
    }
    PyMem_Free(fields->items);
}

/* Field kinds: 1 set, 0 not handled here (the Python path decides), -1 raised. Only exact
   built-in types are handled: a subclass may define __bytes__ (which the Python path
   honours for header values) or __buffer__ (Python code run while a buffer is taken). */
static int field_bytes(PyObject *obj, int nullable, Fields *fields)
{
    if (obj == Py_None && !nullable)
        return 0;
    if (obj != Py_None && !PyBytes_CheckExact(obj) && !PyByteArray_CheckExact(obj)
            && !Py_IS_TYPE(obj, &PyMemoryView_Type))
        return 0;
    Field *field = fields_add(fields);
    if (field == NULL)
        return -1;
    if (obj == Py_None) {
        field->len = -1;
    } else if (PyBytes_CheckExact(obj)) {
        field->owner = Py_NewRef(obj);
        field->data = PyBytes_AS_STRING(obj);
        field->len = PyBytes_GET_SIZE(obj);
    } else {
        if (PyObject_GetBuffer(obj, &field->view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear(); /* a strided or released view: the Python path words it */
            field->view.obj = NULL;
            return 0;
        }
        field->data = field->view.buf;
        field->len = field->view.len;
    }
    return 1;
}

static int field_str(PyObject *obj, Fields *fields)
{
    if (!PyUnicode_CheckExact(obj))
        return 0;
    Field *field = fields_add(fields);
    if (field == NULL)
        return -1;
    field->data = PyUnicode_AsUTF8AndSize(obj, &field->len);
    if (field->data == NULL) {
        PyErr_Clear(); /* not UTF-8 (a lone surrogate): the Python path words it */
        return 0;
    }
    field->owner = Py_NewRef(obj);
    return 1;
}

/* A header value as event.header_value stores it: bytes, str as UTF-8, None as b"". */
static int field_header_value(PyObject *obj, Fields *fields)
{
    if (obj == Py_None) {
        Field *field = fields_add(fields);
        if (field == NULL)
            return -1;
        field->data = "";
        return 1;
    }
    if (PyUnicode_CheckExact(obj))
        return field_str(obj, fields);
    return field_bytes(obj, 0, fields);
}

/* The record-size arithmetic: 0 once the size reaches MAX_BATCH (aiokafka would drop the
   record; its path decides). Both operands stay below 2**31, so the sum cannot overflow. */
static int add_size(int64_t *size, int64_t n)
{
    if (n >= MAX_BATCH)
        return 0;
    *size += n;
    return *size < MAX_BATCH;
}

static int add_field_size(int64_t *size, const Field *field)
{
    int64_t len = field->len;
    return add_size(size, varint_size(len)) && (len <= 0 || add_size(size, len));
}

/* One record's plan: its fields are fields->items[field...], key, body, then a name and a
   value per header; size counts its bytes after the length varint. */
typedef struct {
    int64_t timestamp_delta;
    int64_t size;
    Py_ssize_t field;
    Py_ssize_t headers;
} Record;

/* Pin an event's fields and size its record; 1, 0 (fall back) or -1 (raised). */
static int plan_record(PyObject *event, int64_t index, Record *record, Fields *fields)
{
    PyObject *headers = PyTuple_GET_ITEM(event, 2);
    int ok;
    record->field = fields->count;
    if ((ok = field_bytes(PyTuple_GET_ITEM(event, 1), 1, fields)) <= 0
            || (ok = field_bytes(PyTuple_GET_ITEM(event, 0), 0, fields)) <= 0)
        return ok;
    record->headers = 0;
    if (headers != Py_None) {
        Py_ssize_t pos = 0;
        PyObject *name, *value;
        if (!PyDict_CheckExact(headers))
            return 0;
        /* nothing here runs Python code (exact types only), so the dict cannot change */
        while (PyDict_Next(headers, &pos, &name, &value)) {
            if ((ok = field_str(name, fields)) <= 0 || (ok = field_header_value(value, fields)) <= 0)
                return ok;
            record->headers++;
        }
    }
    record->size = 1;  /* attributes */
    if (!add_size(&record->size, varint_size(record->timestamp_delta))
            || !add_size(&record->size, varint_size(index))
            || !add_size(&record->size, varint_size(record->headers)))
        return 0;
    for (Py_ssize_t i = record->field; i < fields->count; i++)
        if (!add_field_size(&record->size, &fields->items[i]))
            return 0;
    return 1;
}

/* An event's timestamp: 1 and *ts set, or 0 when not an int in [0, 2**63). */
static int event_timestamp(PyObject *event, int64_t now, int64_t *ts)
{
    PyObject *value = PyTuple_GET_ITEM(event, 3);
    int overflow;
    if (value == Py_None) {
        *ts = now;
        return 1;
    }
    if (!PyLong_CheckExact(value))
        return 0;
    *ts = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (*ts == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return *ts >= 0;
}

/* 1 and *out set; 0 when obj does not fit int64; -1 when not an int (raised). */
static int int64_arg(PyObject *obj, int64_t *out)
{
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (*out == -1 && PyErr_Occurred())
        return -1;
    return overflow ? 0 : 1;
}

/* Pass 1: check every event, pin its fields and size its record; the batch's size, 0 to
   fall back, -1 raised. */
static int64_t plan_batch(PyObject *events, Py_ssize_t n, int64_t now, Record *records,
                          Fields *fields, int64_t *first, int64_t *max_ts)
{
    int64_t total = HEADER_SIZE;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *event = PyTuple_GET_ITEM(events, i);
        int64_t ts;
        int ok;
        if (!PyTuple_Check(event) || PyTuple_GET_SIZE(event) != 4
                || !event_timestamp(event, now, &ts))
            return 0;
        if (i == 0)
            *first = *max_ts = ts;
        else if (ts > *max_ts)
            *max_ts = ts;
        records[i].timestamp_delta = ts - *first;  /* both in [0, 2**63): no overflow */
        if ((ok = plan_record(event, i, &records[i], fields)) <= 0)
            return ok;
        if (!add_size(&total, varint_size(records[i].size)) || !add_size(&total, records[i].size))
            return 0;
    }
    return total;
}

/* Bounded writers for pass 2: 0 when the bytes would pass `end`. */
static int write_varint(unsigned char **p, const unsigned char *end, int64_t v)
{
    if (varint_size(v) > end - *p)
        return 0;
    *p = put_varint(*p, v);
    return 1;
}

static int write_field(unsigned char **p, const unsigned char *end, const Field *field)
{
    if (!write_varint(p, end, field->len))
        return 0;
    if (field->len <= 0)
        return 1;
    if (field->len > end - *p)
        return 0;
    memcpy(*p, field->data, (size_t)field->len);
    *p += field->len;
    return 1;
}

/* Pass 2: the records from the pinned fields, each checked against `end` and its size. */
static int write_records(unsigned char *p, const unsigned char *end, const Record *records,
                         Py_ssize_t n, const Fields *fields)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        const Record *record = &records[i];
        const Field *field = &fields->items[record->field];
        unsigned char *start;
        if (!write_varint(&p, end, record->size) || p == end)
            return 0;
        start = p;
        *p++ = 0;  /* attributes */
        if (!write_varint(&p, end, record->timestamp_delta) || !write_varint(&p, end, i)
                || !write_field(&p, end, &field[0]) || !write_field(&p, end, &field[1])
                || !write_varint(&p, end, record->headers))
            return 0;
        for (Py_ssize_t h = 0; h < 2 * record->headers; h++)
            if (!write_field(&p, end, &field[2 + h]))
                return 0;
        if (p - start != record->size)
            return 0;
    }
    return p == end;
}

static void write_header(unsigned char *buf, int64_t total, Py_ssize_t n, int64_t first,
                         int64_t max_ts, int transactional, int64_t producer_id)
{
    put_be64(buf, 0);                                 /* baseOffset: the log sets it */
    put_be32(buf + 8, (uint32_t)(total - LOG_OVERHEAD));
    put_be32(buf + 12, 0xFFFFFFFFu);                  /* partitionLeaderEpoch -1 */
    buf[16] = MAGIC;
    put_be16(buf + ATTRIBUTES_AT, transactional ? TRANSACTIONAL_MASK : 0);
    put_be32(buf + 23, (uint32_t)(n - 1));            /* lastOffsetDelta */
    put_be64(buf + 27, (uint64_t)first);
    put_be64(buf + 35, (uint64_t)max_ts);
    put_be64(buf + 43, (uint64_t)producer_id);
    put_be16(buf + 51, transactional ? 0 : 0xFFFF);   /* producerEpoch: 0, else -1 */
    put_be32(buf + 53, 0xFFFFFFFFu);                  /* baseSequence -1 */
    put_be32(buf + 57, (uint32_t)n);
    put_be32(buf + CRC_AT, crc_impl(0, buf + CRC_START, (size_t)(total - CRC_START)));
}

/* The batch of `events` (a tuple, held by the caller); None to fall back, NULL raised. */
static PyObject *encode_events(PyObject *events, int64_t now, int transactional,
                               int64_t producer_id)
{
    Py_ssize_t n = PyTuple_GET_SIZE(events);
    Fields fields = {NULL, 0, 0};
    PyObject *batch = NULL;
    int64_t first = 0, max_ts = 0, total;
    Record *records = PyMem_Calloc((size_t)n, sizeof(Record));
    if (records == NULL)
        return PyErr_NoMemory();
    total = plan_batch(events, n, now, records, &fields, &first, &max_ts);
    if (total > 0) {
        batch = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total);
        if (batch != NULL) {
            unsigned char *buf = (unsigned char *)PyByteArray_AS_STRING(batch);
            if (write_records(buf + HEADER_SIZE, buf + total, records, n, &fields)) {
                write_header(buf, total, n, first, max_ts, transactional, producer_id);
            } else {  /* cannot happen with pinned fields; never hand out a wrong batch */
                Py_SETREF(batch, Py_NewRef(Py_None));
            }
        }
    } else if (total == 0) {
        batch = Py_NewRef(Py_None);
    }
    fields_release(&fields);
    PyMem_Free(records);
    return batch;
}

static PyObject *encode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *events, *batch;
    int64_t now, producer_id = -1;
    int transactional, ok;

    if (!check_nargs("encode", nargs, 3))
        return NULL;
    transactional = args[1] != Py_None;
    if ((ok = int64_arg(args[2], &now)) <= 0
            || (transactional && (!PyLong_CheckExact(args[1])
                                  || (ok = int64_arg(args[1], &producer_id)) <= 0))) {
        if (ok < 0)
            PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (!PyList_CheckExact(args[0]) && !PyTuple_CheckExact(args[0]))
        Py_RETURN_NONE;
    /* a tuple holds every event through both passes: a caller's list changed meanwhile
       (by another thread) is read as it was */
    events = PySequence_Tuple(args[0]);
    if (events == NULL)
        return NULL;
    if (PyTuple_GET_SIZE(events) == 0 || PyTuple_GET_SIZE(events) > INT32_MAX)
        batch = Py_NewRef(Py_None);
    else
        batch = encode_events(events, now, transactional, producer_id);
    Py_DECREF(events);
    return batch;
}

/* ---- a put's events -------------------------------------------------------------------- */

/* plain_events(events) -> bool: True when `events` (a list or tuple) holds only
   PendingEvents (the exact class, four fields) with a bytes body, a bytes or None key, no
   headers and no timestamp: events a put takes as they are. Exact types only, so no
   Python code runs here and nothing is allocated. False for anything else (the caller
   checks those one by one, and words the error). */
static PyObject *plain_events(PyObject *module, PyObject *events)
{
    PyObject **items;
    Py_ssize_t n;
    if (PyList_CheckExact(events)) {
        items = ((PyListObject *)events)->ob_item;
        n = PyList_GET_SIZE(events);
    } else if (PyTuple_CheckExact(events)) {
        items = ((PyTupleObject *)events)->ob_item;
        n = PyTuple_GET_SIZE(events);
    } else {
        Py_RETURN_FALSE;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *event = items[i], *key;
        if (!Py_IS_TYPE(event, (PyTypeObject *)pending_type) || PyTuple_GET_SIZE(event) != 4)
            Py_RETURN_FALSE;
        key = PyTuple_GET_ITEM(event, 1);
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(event, 0))
                || (key != Py_None && !PyBytes_CheckExact(key))
                || PyTuple_GET_ITEM(event, 2) != Py_None || PyTuple_GET_ITEM(event, 3) != Py_None)
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* The str body of `object` when it is exactly {"body": <str>} (exact dict, exact str
   key and value), else NULL (nothing raised). Borrowed. */
static PyObject *text_body(PyObject *object)
{
    Py_ssize_t pos = 0;
    PyObject *name, *body;
    if (!PyDict_CheckExact(object) || PyDict_GET_SIZE(object) != 1
            || !PyDict_Next(object, &pos, &name, &body))
        return NULL;
    if (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(body)
            || PyUnicode_CompareWithASCIIString(name, "body") != 0)
        return NULL;
    return body;
}

/* A PendingEvent(body, None, None, None) owning `body` (stolen); NULL raised. */
static PyObject *pending_event(PyObject *body)
{
    PyObject *event = ((PyTypeObject *)pending_type)->tp_alloc((PyTypeObject *)pending_type, 4);
    if (event == NULL) {
        Py_DECREF(body);
        return NULL;
    }
    PyTuple_SET_ITEM(event, 0, body);
    for (int i = 1; i < 4; i++)
        PyTuple_SET_ITEM(event, i, Py_NewRef(Py_None));
    return event;
}

/* events_from_texts(objects) -> list | None: for a list of objects each exactly
   {"body": <str>} (what a JSON produce request most often holds), a new list of
   PendingEvent(<the str's UTF-8 bytes>), in order. None when `objects` is not a list, or
   any object is another shape, or a str does not encode (a lone surrogate): the caller
   then reads them one by one, and words any error. It reads a tuple of the list's items
   (a reference held on each), so a list changed by another thread meanwhile is not read
   half old, half new; each object's shape is checked again as it is read. */
static PyObject *events_from_texts(PyObject *module, PyObject *objects)
{
    PyObject *snapshot, *out = NULL;
    if (!PyList_CheckExact(objects))
        Py_RETURN_NONE;
    snapshot = PySequence_Tuple(objects);
    if (snapshot == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(snapshot);
    for (Py_ssize_t i = 0; i < n; i++)  /* the shape first: decline before allocating */
        if (text_body(PyTuple_GET_ITEM(snapshot, i)) == NULL)
            goto decline;
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* the dict is held by the snapshot; its value is held here while it is read */
        PyObject *text = text_body(PyTuple_GET_ITEM(snapshot, i)), *body, *event;
        if (text == NULL)  /* changed since the first pass: only by another thread */
            goto decline;
        Py_INCREF(text);
        /* as str.encode(): one copy, and no UTF-8 copy cached in the str */
        body = PyUnicode_AsUTF8String(text);
        Py_DECREF(text);
        if (body == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
                Py_CLEAR(out);
                goto done;
            }
            PyErr_Clear();  /* a lone surrogate: the caller's str.encode() words it */
            goto decline;
        }
        if ((event = pending_event(body)) == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, event);
    }
    goto done;
decline:
    Py_XDECREF(out);
    out = Py_NewRef(Py_None);
done:
    Py_DECREF(snapshot);
    return out;
}

/* ---- decode ---------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *buf;
    Py_ssize_t len;
    Py_ssize_t pos;
} Reader;

static int corrupt(const char *format, ...)
{
    va_list vargs;
    va_start(vargs, format);
    PyObject *message = PyUnicode_FromFormatV(format, vargs);
    va_end(vargs);
    if (message != NULL) {
        PyErr_SetObject(corrupt_error, message);
        Py_DECREF(message);
    }
    return -1;
}

static int check_bounds(Reader *r, Py_ssize_t pos, int64_t size)
{
    if (size > (int64_t)(r->len - pos))
        return corrupt("Can't read %lld bytes from pos %zd", (long long)size, pos);
    return 0;
}

/* aiokafka's decode_varint64: at most 10 bytes, zig-zag; each byte bounds-checked. */
static int read_varint(Reader *r, int64_t *out)
{
    uint64_t value = 0;
    int shift = 0;
    while (1) {
        if (check_bounds(r, r->pos, 1) < 0)
            return -1;
        unsigned char byte = r->buf[r->pos++];
        value |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80))
            break;
        shift += 7;
        if (shift > 63)
            return corrupt("Out of double range");
    }
    *out = (int64_t)(value >> 1) ^ -(int64_t)(value & 1);
    return 0;
}

/* Nullable bytes: a length then the bytes; *out a new reference (None for null). */
static int read_bytes(Reader *r, PyObject **out)
{
    int64_t len;
    if (read_varint(r, &len) < 0)
        return -1;
    if (len < 0) {
        Py_INCREF(Py_None);
        *out = Py_None;
        return 0;
    }
    if (check_bounds(r, r->pos, len) < 0)
        return -1;
    *out = PyBytes_FromStringAndSize((const char *)r->buf + r->pos, (Py_ssize_t)len);
    r->pos += (Py_ssize_t)len;
    return *out == NULL ? -1 : 0;
}

static int read_headers(Reader *r, PyObject *dict)
{
    int64_t count, name_len;
    if (read_varint(r, &count) < 0)
        return -1;
    if (count < 0)
        return corrupt("Found invalid number of record headers %lld", (long long)count);
    for (; count > 0; count--) {
        if (read_varint(r, &name_len) < 0)
            return -1;
        if (name_len < 0)
            return corrupt("Invalid negative header key size %lld", (long long)name_len);
        if (check_bounds(r, r->pos, name_len) < 0)
            return -1;
        const char *name_at = (const char *)r->buf + r->pos;
        r->pos += (Py_ssize_t)name_len;
        PyObject *value, *name;
        if (read_bytes(r, &value) < 0)
            return -1;
        name = PyUnicode_DecodeUTF8(name_at, (Py_ssize_t)name_len, NULL);
        if (name == NULL || PyDict_SetItem(dict, name, value) < 0) {
            Py_XDECREF(name);
            Py_DECREF(value);
            return -1;
        }
        Py_DECREF(name);
        Py_DECREF(value);
    }
    return 0;
}

typedef struct {
    int64_t base_offset, first_timestamp, max_timestamp;
    int log_append_time;
} BatchInfo;

/* A plain (uncompressed, unencrypted) batch's header fields: 1, or 0 when the buffer is
   shorter than a header or its batch is not plain (the callers decline it). */
static int plain_batch_info(const Py_buffer *view, BatchInfo *info, int32_t *count)
{
    const unsigned char *buf = view->buf;
    if (view->len < HEADER_SIZE || buf[ATTRIBUTES_AT + 1] & (CODEC_MASK | ENCRYPTED_MASK))
        return 0;
    info->base_offset = (int64_t)get_be64(buf);
    info->first_timestamp = (int64_t)get_be64(buf + 27);
    info->max_timestamp = (int64_t)get_be64(buf + 35);
    info->log_append_time = (buf[ATTRIBUTES_AT + 1] & TIMESTAMP_TYPE_MASK) != 0;
    *count = (int32_t)get_be32(buf + 57);
    return 1;
}

/* The next record as an Event's fields (items[1..5]), offset in *offset; -1 on error. */
static int read_record(Reader *r, const BatchInfo *info, int64_t *offset, PyObject **items)
{
    int64_t length, attributes, ts_delta, offset_delta, timestamp;
    Py_ssize_t start;
    if (read_varint(r, &length) < 0)
        return -1;
    start = r->pos;
    if (read_varint(r, &attributes) < 0 || read_varint(r, &ts_delta) < 0)
        return -1;
    timestamp = info->log_append_time ? info->max_timestamp
              : (int64_t)((uint64_t)info->first_timestamp + (uint64_t)ts_delta);
    if (read_varint(r, &offset_delta) < 0)
        return -1;
    *offset = (int64_t)((uint64_t)info->base_offset + (uint64_t)offset_delta);
    if (read_bytes(r, &items[3]) < 0)
        return -1;
    if (read_bytes(r, &items[5]) < 0)
        return -1;
    items[4] = PyDict_New();
    if (items[4] == NULL || read_headers(r, items[4]) < 0)
        return -1;
    if (r->pos - start != length)
        return corrupt("Invalid record size: expected to read %lld bytes in record payload, "
                       "but instead read %zd", (long long)length, r->pos - start);
    if ((items[2] = PyLong_FromLongLong(timestamp)) == NULL)
        return -1;
    if (items[5] == Py_None) {
        Py_DECREF(items[5]);
        items[5] = PyBytes_FromStringAndSize(NULL, 0);
        if (items[5] == NULL)
            return -1;
    }
    return 0;
}

static int append_event(PyObject *out, PyObject *partition, int64_t offset, PyObject **items)
{
    items[1] = PyLong_FromLongLong(offset);
    if (items[1] == NULL)
        return -1;
    PyObject *event = ((PyTypeObject *)event_type)->tp_alloc((PyTypeObject *)event_type, 6);
    if (event == NULL)
        return -1;
    Py_INCREF(partition);
    PyTuple_SET_ITEM(event, 0, partition);
    for (int i = 1; i < 6; i++) {
        PyTuple_SET_ITEM(event, i, items[i]);
        items[i] = NULL;
    }
    int status = PyList_Append(out, event);
    Py_DECREF(event);
    return status;
}

/* The _decode loop over a held buffer; 1 done, -1 error (raised). */
static int decode_records(Reader *r, const BatchInfo *info, int32_t count, PyObject *partition,
                          int64_t start, int64_t stop, int64_t limit, PyObject *out)
{
    for (int32_t i = 0; i < count; i++) {
        PyObject *items[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
        int64_t offset;
        int status = read_record(r, info, &offset, items);
        if (status == 0) {
            if (offset < start)
                status = 2;
            else if (offset >= stop || PyList_GET_SIZE(out) >= limit)
                status = 3;
            else
                status = append_event(out, partition, offset, items);
        }
        for (int k = 1; k < 6; k++)
            Py_XDECREF(items[k]);
        if (status < 0)
            return -1;
        if (status == 3)
            return 1;
    }
    if (r->pos != r->len)
        return corrupt("%zd unconsumed bytes after all records consumed", r->len - r->pos);
    return 1;
}

static PyObject *decode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    int64_t start, stop, limit;
    int ok;
    if (!check_nargs("decode", nargs, 6))
        return NULL;
    if (!PyList_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError, "decode: out must be a list");
        return NULL;
    }
    if ((ok = int64_arg(args[2], &start)) <= 0 || (ok = int64_arg(args[3], &stop)) <= 0
            || (ok = int64_arg(args[4], &limit)) <= 0) {
        if (ok < 0)
            return NULL;
        Py_RETURN_FALSE;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    BatchInfo info;
    int32_t count;
    if (!plain_batch_info(&view, &info, &count)) {
        PyBuffer_Release(&view);
        Py_RETURN_FALSE;
    }
    Reader reader = {view.buf, view.len, HEADER_SIZE};
    int status = decode_records(&reader, &info, count, args[1], start, stop, limit, args[5]);
    PyBuffer_Release(&view);
    if (status < 0)
        return NULL;
    Py_RETURN_TRUE;
}

/* ---- columns: records straight into Arrow buffers -------------------------------------- */

/* One Arrow buffer being filled: a bytearray whose size is the capacity (so take() hands it
   to pyarrow without a copy), `len` bytes of it used. */
typedef struct {
    PyObject *bytes;
    Py_ssize_t len;
} Growable;

enum {
    COL_OFFSETS, COL_TIMESTAMPS, COL_KEY_VALID, COL_KEY_ENDS, COL_KEY_DATA, COL_VALUE_ENDS,
    COL_VALUE_DATA, COL_HEADER_ENDS, COL_NAME_ENDS, COL_NAME_DATA, COL_HVALUE_VALID,
    COL_HVALUE_ENDS, COL_HVALUE_DATA, COL_KEY_TEXT, COL_KEY_RAW, COL_VALUE_TEXT, COL_VALUE_RAW,
    COL_HVALUE_RAW, COLUMN_BUFFERS
};

typedef struct {
    const unsigned char *name, *value;
    Py_ssize_t name_len;
    int64_t value_len;  /* -1: null */
} HeaderRef;

typedef struct {
    Py_ssize_t rows, entries, key_nulls, hvalue_nulls, key_raws, value_raws, hvalue_raws;
    Py_ssize_t lens[COLUMN_BUFFERS];
} ColumnsMark;

typedef struct {
    PyObject_HEAD
    Growable buffers[COLUMN_BUFFERS];
    Py_ssize_t rows, entries, key_nulls, hvalue_nulls, key_raws, value_raws, hvalue_raws;
    HeaderRef *headers;  /* one record's headers, as read */
    Py_ssize_t headers_allocated;
    int32_t *slots;      /* hash table over a record's distinct names (many headers) */
    Py_ssize_t slots_allocated;
    int busy;            /* inside append/take: a finalizer run by an allocation cannot re-enter */
    int readable;        /* tell text from bytes (the text and raw bitmaps) */
} ColumnBuffers;

#define ARROW_MAX_DATA 0x7FFFFFFF  /* int32 offsets: an Arrow binary column's data limit */
#define LINEAR_HEADERS 16          /* up to this many headers a record is deduplicated by scan */

static int grow(Growable *g, Py_ssize_t extra)
{
    Py_ssize_t capacity = PyByteArray_GET_SIZE(g->bytes), want;
    if (extra <= capacity - g->len)
        return 0;
    if (extra > PY_SSIZE_T_MAX / 2 - g->len) {
        PyErr_NoMemory();
        return -1;
    }
    want = g->len + extra;
    capacity = capacity < 256 ? 256 : capacity;
    while (capacity < want)
        capacity *= 2;
    return PyByteArray_Resize(g->bytes, capacity);
}

static unsigned char *tail(Growable *g) { return (unsigned char *)PyByteArray_AS_STRING(g->bytes) + g->len; }

static int put_fixed(Growable *g, const void *value, Py_ssize_t size)
{
    if (grow(g, size) < 0)
        return -1;
    memcpy(tail(g), value, (size_t)size);
    g->len += size;
    return 0;
}

static int put_int64(Growable *g, int64_t v) { return put_fixed(g, &v, 8); }

/* Data bytes then the int32 end offset after them; OverflowError past 2 GiB (the caller
   cuts RecordBatches before, so this only guards the int32 offsets). */
static int put_binary(Growable *ends, Growable *data, const unsigned char *p, int64_t len)
{
    if (len > ARROW_MAX_DATA - data->len) {
        PyErr_SetString(PyExc_OverflowError, "an Arrow binary column holds at most 2 GiB: "
                                             "cut the RecordBatch before");
        return -1;
    }
    if (len > 0) {
        if (grow(data, (Py_ssize_t)len) < 0)
            return -1;
        memcpy(tail(data), p, (size_t)len);
        data->len += (Py_ssize_t)len;
    }
    int32_t end = (int32_t)data->len;
    return put_fixed(ends, &end, 4);
}

/* Bit `index` of a validity bitmap (Arrow's LSB order), set or cleared explicitly: a
   rolled-back append may have left the byte's higher bits set. */
static int put_bit(Growable *bitmap, Py_ssize_t index, int valid)
{
    if (index % 8 == 0) {
        if (grow(bitmap, 1) < 0)
            return -1;
        *tail(bitmap) = 0;
        bitmap->len++;
    }
    unsigned char *byte = (unsigned char *)PyByteArray_AS_STRING(bitmap->bytes) + index / 8;
    unsigned char mask = (unsigned char)(1u << (index % 8));
    *byte = valid ? (*byte | mask) : (*byte & ~mask);
    return 0;
}

/* Fresh, empty buffers; every offsets buffer starts with its leading 0. All are made before
   any is swapped in, so that a failed allocation leaves the object as it was (every buffer
   present, the counts matching them) rather than with a hole the next append writes into. */
static int columns_reset(ColumnBuffers *self)
{
    static const int32_t zero = 0;
    static const int starts[] = {COL_KEY_ENDS, COL_VALUE_ENDS, COL_HEADER_ENDS, COL_NAME_ENDS,
                                 COL_HVALUE_ENDS};
    Growable fresh[COLUMN_BUFFERS] = {{NULL, 0}};
    for (int i = 0; i < COLUMN_BUFFERS; i++)
        if ((fresh[i].bytes = PyByteArray_FromStringAndSize(NULL, 0)) == NULL)
            goto fail;
    for (size_t i = 0; i < sizeof(starts) / sizeof(starts[0]); i++)
        if (put_fixed(&fresh[starts[i]], &zero, 4) < 0)
            goto fail;
    for (int i = 0; i < COLUMN_BUFFERS; i++) {
        Py_XSETREF(self->buffers[i].bytes, fresh[i].bytes);
        self->buffers[i].len = fresh[i].len;
    }
    self->rows = self->entries = self->key_nulls = self->hvalue_nulls = 0;
    self->key_raws = self->value_raws = self->hvalue_raws = 0;
    return 0;
fail:
    for (int i = 0; i < COLUMN_BUFFERS; i++)
        Py_XDECREF(fresh[i].bytes);
    return -1;
}

static void columns_mark(const ColumnBuffers *self, ColumnsMark *mark)
{
    mark->rows = self->rows;
    mark->entries = self->entries;
    mark->key_nulls = self->key_nulls;
    mark->hvalue_nulls = self->hvalue_nulls;
    mark->key_raws = self->key_raws;
    mark->value_raws = self->value_raws;
    mark->hvalue_raws = self->hvalue_raws;
    for (int i = 0; i < COLUMN_BUFFERS; i++)
        mark->lens[i] = self->buffers[i].len;
}

static void columns_rollback(ColumnBuffers *self, const ColumnsMark *mark)
{
    self->rows = mark->rows;
    self->entries = mark->entries;
    self->key_nulls = mark->key_nulls;
    self->hvalue_nulls = mark->hvalue_nulls;
    self->key_raws = mark->key_raws;
    self->value_raws = mark->value_raws;
    self->hvalue_raws = mark->hvalue_raws;
    for (int i = 0; i < COLUMN_BUFFERS; i++)
        self->buffers[i].len = mark->lens[i];
}

/* A header name as aiokafka reads it: strict UTF-8, its UnicodeDecodeError otherwise. */
static int check_utf8(const unsigned char *p, Py_ssize_t len)
{
    for (Py_ssize_t i = 0; i < len; i++) {
        if (p[i] >= 0x80) {  /* not ASCII: Python's own decoder decides, and words the error */
            PyObject *name = PyUnicode_DecodeUTF8((const char *)p, len, NULL);
            if (name == NULL)
                return -1;
            Py_DECREF(name);
            return 0;
        }
    }
    return 0;
}

/* 1 when p[0..len) is well-formed UTF-8 (Unicode's Table 3-7: no overlong forms, no
   surrogates, nothing past U+10FFFF), else 0. ASCII runs are checked 8 bytes at a time. */
static int is_utf8(const unsigned char *p, int64_t len)
{
    int64_t i = 0;
    while (i < len) {
        uint64_t word;
        if (len - i >= 8 && (memcpy(&word, p + i, 8), !(word & 0x8080808080808080u))) {
            i += 8;
            continue;
        }
        unsigned char c = p[i], low = 0x80, high = 0xBF;  /* the second byte's range */
        int follow;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            follow = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            follow = 2;
            if (c == 0xE0)
                low = 0xA0;   /* shorter forms are overlong */
            if (c == 0xED)
                high = 0x9F;  /* D800-DFFF are surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            follow = 3;
            if (c == 0xF0)
                low = 0x90;   /* overlong */
            if (c == 0xF4)
                high = 0x8F;  /* past U+10FFFF */
        } else {
            return 0;
        }
        if (len - i - 1 < follow || p[i + 1] < low || p[i + 1] > high)
            return 0;
        for (int k = 2; k <= follow; k++)
            if ((p[i + k] & 0xC0) != 0x80)
                return 0;
        i += follow + 1;
    }
    return 1;
}

/* Bit `index` of a raw bitmap, and of a text one unless `text` is NULL, for bytes
   p[0..len) (len -1: null, neither); *raws counts the raw ones. */
static int put_text_bits(Growable *text, Growable *raw, Py_ssize_t index,
                         const unsigned char *p, int64_t len, Py_ssize_t *raws)
{
    int present = len >= 0, utf8 = present && is_utf8(p, len);
    if ((text != NULL && put_bit(text, index, utf8) < 0)
            || put_bit(raw, index, present && !utf8) < 0)
        return -1;
    *raws += present && !utf8;
    return 0;
}

static int add_header_ref(ColumnBuffers *self, Py_ssize_t index, const HeaderRef *ref)
{
    if (index == self->headers_allocated) {
        Py_ssize_t allocated = self->headers_allocated ? self->headers_allocated * 2 : 16;
        HeaderRef *headers = PyMem_Realloc(self->headers, (size_t)allocated * sizeof(HeaderRef));
        if (headers == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->headers = headers;
        self->headers_allocated = allocated;
    }
    self->headers[index] = *ref;
    return 0;
}

/* A record's headers: count, then per header a name (UTF-8) and a nullable value, read
   into self->headers with read_headers' checks in its order; *count set. */
static int read_header_refs(ColumnBuffers *self, Reader *r, Py_ssize_t *count)
{
    int64_t n, name_len;
    if (read_varint(r, &n) < 0)
        return -1;
    if (n < 0)
        return corrupt("Found invalid number of record headers %lld", (long long)n);
    for (Py_ssize_t i = 0; i < n; i++) {
        HeaderRef ref;
        if (read_varint(r, &name_len) < 0)
            return -1;
        if (name_len < 0)
            return corrupt("Invalid negative header key size %lld", (long long)name_len);
        if (check_bounds(r, r->pos, name_len) < 0)
            return -1;
        ref.name = r->buf + r->pos;
        ref.name_len = (Py_ssize_t)name_len;
        r->pos += (Py_ssize_t)name_len;
        if (read_varint(r, &ref.value_len) < 0)
            return -1;
        if (ref.value_len < 0) {
            ref.value_len = -1;
        } else if (check_bounds(r, r->pos, ref.value_len) < 0) {
            return -1;
        }
        ref.value = r->buf + r->pos;
        if (ref.value_len > 0)
            r->pos += (Py_ssize_t)ref.value_len;
        if (check_utf8(ref.name, ref.name_len) < 0 || add_header_ref(self, i, &ref) < 0)
            return -1;
    }
    *count = (Py_ssize_t)n;
    return 0;
}

static int same_name(const HeaderRef *a, const HeaderRef *b)
{
    return a->name_len == b->name_len && memcmp(a->name, b->name, (size_t)a->name_len) == 0;
}

/* FNV-1a from an offset basis salted at import (salt_name_hash), so that names cannot be
   chosen in advance to share a slot, then MurmurHash3's finalizer: FNV's low bits depend on
   the low bits only and its top bits cluster for short similar names; after the finalizer
   every bit depends on every byte, and the table takes the top bits. */
static uint64_t name_basis = 0xcbf29ce484222325u;

static uint64_t name_hash(const HeaderRef *ref)
{
    uint64_t h = name_basis;
    for (Py_ssize_t i = 0; i < ref->name_len; i++)
        h = (h ^ ref->name[i]) * 0x100000001b3u;
    h = (h ^ (h >> 33)) * 0xff51afd7ed558ccdu;
    h = (h ^ (h >> 33)) * 0xc4ceb9fe1a85ec53u;
    return h ^ (h >> 33);
}

static int salt_name_hash(void)
{
    uint64_t salt;
    PyObject *os = PyImport_ImportModule("os");
    if (os == NULL)
        return -1;
    PyObject *bytes = PyObject_CallMethod(os, "urandom", "i", (int)sizeof(salt));
    Py_DECREF(os);
    if (bytes == NULL)
        return -1;
    if (!PyBytes_Check(bytes) || PyBytes_GET_SIZE(bytes) != (Py_ssize_t)sizeof(salt)) {
        Py_DECREF(bytes);
        PyErr_SetString(PyExc_RuntimeError, "os.urandom(8) did not give 8 bytes");
        return -1;
    }
    memcpy(&salt, PyBytes_AS_STRING(bytes), sizeof(salt));
    Py_DECREF(bytes);
    name_basis ^= salt;
    return 0;
}

/* self->headers[0..count) as dict() leaves them: each name once, where it first came, with
   the value it came with last; the number of distinct names. A hash table past a few
   headers, so a damaged or hostile record of many headers costs linear time. */
static Py_ssize_t dedup_headers(ColumnBuffers *self, Py_ssize_t count)
{
    HeaderRef *h = self->headers;
    Py_ssize_t distinct = 0;
    if (count <= LINEAR_HEADERS) {
        for (Py_ssize_t j = 0; j < count; j++) {
            Py_ssize_t i = 0;
            while (i < distinct && !same_name(&h[i], &h[j]))
                i++;
            if (i < distinct)
                h[i].value = h[j].value, h[i].value_len = h[j].value_len;
            else
                h[distinct++] = h[j];
        }
        return distinct;
    }
    Py_ssize_t size = 64;
    int shift = 64 - 6;  /* the top log2(size) bits of the hash pick the slot */
    while (size < 2 * count)
        size *= 2, shift--;
    if (size > self->slots_allocated) {
        int32_t *slots = PyMem_Realloc(self->slots, (size_t)size * sizeof(int32_t));
        if (slots == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->slots = slots;
        self->slots_allocated = size;
    }
    memset(self->slots, 0xFF, (size_t)size * sizeof(int32_t));
    for (Py_ssize_t j = 0; j < count; j++) {
        size_t slot = (size_t)(name_hash(&h[j]) >> shift);
        while (self->slots[slot] >= 0 && !same_name(&h[self->slots[slot]], &h[j]))
            slot = (slot + 1) & (size_t)(size - 1);
        if (self->slots[slot] >= 0) {
            HeaderRef *kept = &h[self->slots[slot]];
            kept->value = h[j].value, kept->value_len = h[j].value_len;
        } else {
            self->slots[slot] = (int32_t)distinct;
            h[distinct++] = h[j];
        }
    }
    return distinct;
}

static int put_headers(ColumnBuffers *self, Py_ssize_t count)
{
    Growable *b = self->buffers;
    Py_ssize_t distinct = dedup_headers(self, count);
    if (distinct < 0)
        return -1;
    for (Py_ssize_t i = 0; i < distinct; i++) {
        const HeaderRef *ref = &self->headers[i];
        if (put_binary(&b[COL_NAME_ENDS], &b[COL_NAME_DATA], ref->name, ref->name_len) < 0
                || put_bit(&b[COL_HVALUE_VALID], self->entries, ref->value_len >= 0) < 0
                || put_binary(&b[COL_HVALUE_ENDS], &b[COL_HVALUE_DATA], ref->value,
                              ref->value_len < 0 ? 0 : ref->value_len) < 0
                || (self->readable
                    && put_text_bits(NULL, &b[COL_HVALUE_RAW], self->entries, ref->value,
                                     ref->value_len, &self->hvalue_raws) < 0))
            return -1;
        self->hvalue_nulls += ref->value_len < 0;
        self->entries++;
    }
    if (self->entries > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "more than 2**31 header entries in a RecordBatch");
        return -1;
    }
    int32_t end = (int32_t)self->entries;
    return put_fixed(&b[COL_HEADER_ENDS], &end, 4);
}

typedef struct {
    int64_t offset, timestamp, key_len, value_len;
    const unsigned char *key, *value;
    Py_ssize_t headers;
} RecordRef;

/* The next record, read with read_record's checks in its order, into *rec (pointers into
   the batch; headers in self->headers). */
static int read_record_ref(ColumnBuffers *self, Reader *r, const BatchInfo *info, RecordRef *rec)
{
    int64_t length, attributes, ts_delta, offset_delta;
    Py_ssize_t start;
    if (read_varint(r, &length) < 0)
        return -1;
    start = r->pos;
    if (read_varint(r, &attributes) < 0 || read_varint(r, &ts_delta) < 0)
        return -1;
    rec->timestamp = info->log_append_time ? info->max_timestamp
                   : (int64_t)((uint64_t)info->first_timestamp + (uint64_t)ts_delta);
    if (read_varint(r, &offset_delta) < 0)
        return -1;
    rec->offset = (int64_t)((uint64_t)info->base_offset + (uint64_t)offset_delta);
    int64_t *lens[2] = {&rec->key_len, &rec->value_len};
    const unsigned char **data[2] = {&rec->key, &rec->value};
    for (int f = 0; f < 2; f++) {
        if (read_varint(r, lens[f]) < 0)
            return -1;
        if (*lens[f] >= 0 && check_bounds(r, r->pos, *lens[f]) < 0)
            return -1;
        *data[f] = r->buf + r->pos;
        if (*lens[f] > 0)
            r->pos += (Py_ssize_t)*lens[f];
    }
    if (read_header_refs(self, r, &rec->headers) < 0)
        return -1;
    if (r->pos - start != length)
        return corrupt("Invalid record size: expected to read %lld bytes in record payload, "
                       "but instead read %zd", (long long)length, r->pos - start);
    return 0;
}

static int put_record(ColumnBuffers *self, const RecordRef *rec)
{
    Growable *b = self->buffers;
    int has_key = rec->key_len >= 0;
    if (put_int64(&b[COL_OFFSETS], rec->offset) < 0
            || put_int64(&b[COL_TIMESTAMPS], rec->timestamp) < 0
            || put_bit(&b[COL_KEY_VALID], self->rows, has_key) < 0
            || put_binary(&b[COL_KEY_ENDS], &b[COL_KEY_DATA], rec->key,
                          has_key ? rec->key_len : 0) < 0
            || put_binary(&b[COL_VALUE_ENDS], &b[COL_VALUE_DATA], rec->value,  /* null: b"" */
                          rec->value_len < 0 ? 0 : rec->value_len) < 0
            || (self->readable
                && (put_text_bits(&b[COL_KEY_TEXT], &b[COL_KEY_RAW], self->rows, rec->key,
                                  rec->key_len, &self->key_raws) < 0
                    || put_text_bits(&b[COL_VALUE_TEXT], &b[COL_VALUE_RAW], self->rows,
                                     rec->value, rec->value_len < 0 ? 0 : rec->value_len,
                                     &self->value_raws) < 0))
            || put_headers(self, rec->headers) < 0)
        return -1;
    self->key_nulls += !has_key;
    self->rows++;
    return 0;
}

/* Every record of the batch read and checked; those with expected <= offset < stop
   appended, which must be expected, expected + 1, ...: *added of them, *gap the first
   offset that broke the run (or -1 with *has_gap 0). Offsets that do not increase from one
   record to the next are corruption (arrow_decode._check_order words it the same), named
   once every record has read, so that a record that does not decode is reported first, as
   on the Python path. */
static int columns_records(ColumnBuffers *self, Reader *r, const BatchInfo *info, int32_t count,
                           int64_t expected, int64_t stop, int64_t *added, int64_t *gap,
                           int *has_gap)
{
    int64_t previous = 0, disorder_after = 0, disorder = 0;
    int disordered = 0;
    for (int32_t i = 0; i < count; i++) {
        RecordRef rec;
        if (read_record_ref(self, r, info, &rec) < 0)
            return -1;
        if (i > 0 && rec.offset <= previous && !disordered)
            disordered = 1, disorder_after = previous, disorder = rec.offset;
        previous = rec.offset;
        if (rec.offset < expected || rec.offset >= stop || *has_gap || disordered)
            continue;
        if (rec.offset != expected + *added) {
            *has_gap = 1;
            *gap = rec.offset;
            continue;
        }
        if (put_record(self, &rec) < 0)
            return -1;
        (*added)++;
    }
    if (r->pos != r->len)
        return corrupt("%zd unconsumed bytes after all records consumed", r->len - r->pos);
    if (disordered)
        return corrupt("Record offset %lld after %lld: offsets must increase",
                       (long long)disorder, (long long)disorder_after);
    return 0;
}

/* append(batch, expected, stop) -> (added, gap) | None: see the module comment. */
static PyObject *columns_append(ColumnBuffers *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    int64_t expected, stop, added = 0, gap = -1;
    int has_gap = 0, ok;
    if (!check_nargs("append", nargs, 3))
        return NULL;
    if ((ok = int64_arg(args[1], &expected)) <= 0 || (ok = int64_arg(args[2], &stop)) <= 0) {
        if (ok == 0)
            PyErr_SetString(PyExc_OverflowError, "append: expected and stop must fit int64");
        return NULL;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "ColumnBuffers is in use");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    BatchInfo info;
    int32_t count;
    if (!plain_batch_info(&view, &info, &count)) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    Reader reader = {view.buf, view.len, HEADER_SIZE};
    ColumnsMark mark;
    columns_mark(self, &mark);
    self->busy = 1;
    int status = columns_records(self, &reader, &info, count, expected,
                                 stop, &added, &gap, &has_gap);
    self->busy = 0;
    PyBuffer_Release(&view);
    if (status < 0) {  /* never part of a batch */
        columns_rollback(self, &mark);
        return NULL;
    }
    PyObject *result = has_gap ? Py_BuildValue("(LL)", (long long)added, (long long)gap)
                               : Py_BuildValue("(LO)", (long long)added, Py_None);
    if (result == NULL)  /* the caller never learns of these rows: they must not stay */
        columns_rollback(self, &mark);
    return result;
}

/* take() -> (rows, key_nulls, header_entries, header_value_nulls, key_raws, value_raws,
   header_value_raws, 18 bytearrays) */
static PyObject *columns_take(ColumnBuffers *self, PyObject *unused)
{
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "ColumnBuffers is in use");
        return NULL;
    }
    enum { COUNTS = 7 };
    PyObject *result = PyTuple_New(COUNTS + COLUMN_BUFFERS);
    if (result == NULL)
        return NULL;
    Py_ssize_t counts[COUNTS] = {self->rows, self->key_nulls, self->entries, self->hvalue_nulls,
                                 self->key_raws, self->value_raws, self->hvalue_raws};
    for (int i = 0; i < COUNTS; i++) {
        PyObject *n = PyLong_FromSsize_t(counts[i]);
        if (n == NULL)
            goto fail;
        PyTuple_SET_ITEM(result, i, n);
    }
    self->busy = 1;
    for (int i = 0; i < COLUMN_BUFFERS; i++) {
        Growable *g = &self->buffers[i];
        if (PyByteArray_Resize(g->bytes, g->len) < 0) {
            self->busy = 0;
            goto fail;
        }
    }
    for (int i = 0; i < COLUMN_BUFFERS; i++)
        PyTuple_SET_ITEM(result, COUNTS + i, Py_NewRef(self->buffers[i].bytes));
    int status = columns_reset(self);
    self->busy = 0;
    if (status < 0)
        goto fail;
    return result;
fail:
    Py_DECREF(result);
    return NULL;
}

static PyObject *columns_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"readable", NULL};
    int readable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p:ColumnBuffers", keywords, &readable))
        return NULL;
    ColumnBuffers *self = (ColumnBuffers *)type->tp_alloc(type, 0);
    if (self != NULL && columns_reset(self) < 0)
        Py_CLEAR(self);
    if (self != NULL)
        self->readable = readable;
    return (PyObject *)self;
}

static void columns_dealloc(ColumnBuffers *self)
{
    for (int i = 0; i < COLUMN_BUFFERS; i++)
        Py_XDECREF(self->buffers[i].bytes);
    PyMem_Free(self->headers);
    PyMem_Free(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t columns_length(ColumnBuffers *self) { return self->rows; }

static PyMethodDef columns_methods[] = {
    {"append", (PyCFunction)(void (*)(void))columns_append, METH_FASTCALL,
     "append(batch, expected, stop) -> (added, gap offset or None), or None: add the records "
     "with expected <= offset < stop of a plain batch."},
    {"take", (PyCFunction)columns_take, METH_NOARGS,
     "take() -> (rows, key nulls, header entries, header value nulls, *buffers); empties."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods columns_sequence = {.sq_length = (lenfunc)columns_length};

static PyTypeObject ColumnBuffersType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "channel_engine.log._batch_codec.ColumnBuffers",
    .tp_basicsize = sizeof(ColumnBuffers),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Arrow buffers filled from plain record batches: see _batch_codec.c.",
    .tp_new = columns_new,
    .tp_dealloc = (destructor)columns_dealloc,
    .tp_methods = columns_methods,
    .tp_as_sequence = &columns_sequence,
};

/* crc32c(data, portable=False): the CRC-32C encode writes; `portable` forces the code
   for CPUs without the instruction (slice-by-8, or bytewise on a big-endian host), so that
   a test checks it on a CPU that has the instruction. */
static PyObject *crc32c(PyObject *module, PyObject *args)
{
    Py_buffer view;
    int portable = 0;
    if (!PyArg_ParseTuple(args, "y*|p:crc32c", &view, &portable))
        return NULL;
#if PY_LITTLE_ENDIAN
    uint32_t (*portable_impl)(uint32_t, const unsigned char *, size_t) = crc_software;
#else
    uint32_t (*portable_impl)(uint32_t, const unsigned char *, size_t) = crc_bytewise;
#endif
    uint32_t crc = (portable ? portable_impl : crc_impl)(0, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"encode", (PyCFunction)(void (*)(void))encode, METH_FASTCALL,
     "encode(events, transaction_id, now) -> bytearray or None: an uncompressed batch."},
    {"decode", (PyCFunction)(void (*)(void))decode, METH_FASTCALL,
     "decode(batch, partition, start, stop, limit, out) -> bool: append its Events."},
    {"plain_events", plain_events, METH_O,
     "plain_events(events) -> bool: PendingEvents a put takes as they are."},
    {"events_from_texts", events_from_texts, METH_O,
     "events_from_texts(objects) -> list or None: PendingEvents of {\"body\": str} objects."},
    {"crc32c", crc32c, METH_VARARGS,
     "crc32c(data, portable=False) -> int: CRC-32C of a buffer, as encode computes it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_batch_codec",
    "Kafka record batch v2 (uncompressed) encode and decode in C: see _batch_codec.c.",
    -1, methods,
};

/* getattr(import(module), name), checked to be a class; NULL raised. */
static PyObject *import_class(const char *module_name, const char *name)
{
    PyObject *module = PyImport_ImportModule(module_name), *cls;
    if (module == NULL)
        return NULL;
    cls = PyObject_GetAttrString(module, name);
    Py_DECREF(module);
    if (cls != NULL && !PyType_Check(cls)) {
        PyErr_Format(PyExc_TypeError, "_batch_codec: %s.%s is not a class", module_name, name);
        Py_CLEAR(cls);
    }
    return cls;
}

/* The classes decode makes and raises, taken at import (the package's modules are in
   sys.modules by then: a parent package is imported before its extension), so no call
   can find them missing. Event must be a plain tuple subclass: decode fills its slots. */
static int import_classes(void)
{
    PyObject *event = import_class("channel_engine.event", "Event");
    PyObject *pending = import_class("channel_engine.event", "PendingEvent");
    PyObject *error = import_class("aiokafka.errors", "CorruptRecordException");
    if (event == NULL || pending == NULL || error == NULL)
        goto fail;
    if (!PyType_IsSubtype((PyTypeObject *)event, &PyTuple_Type)
            || ((PyTypeObject *)event)->tp_dictoffset != 0
            || !PyType_IsSubtype((PyTypeObject *)pending, &PyTuple_Type)
            || ((PyTypeObject *)pending)->tp_dictoffset != 0 || !PyExceptionClass_Check(error)) {
        PyErr_SetString(PyExc_TypeError, "_batch_codec: Event and PendingEvent must be "
                                         "NamedTuple classes and CorruptRecordException an "
                                         "exception class");
        goto fail;
    }
    Py_XSETREF(event_type, event);
    Py_XSETREF(pending_type, pending);
    Py_XSETREF(corrupt_error, error);
    return 0;
fail:
    Py_XDECREF(event);
    Py_XDECREF(pending);
    Py_XDECREF(error);
    return -1;
}

PyMODINIT_FUNC PyInit__batch_codec(void)
{
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (import_classes() < 0 || salt_name_hash() < 0) {
        Py_DECREF(module);
        return NULL;
    }
    crc_init();
#ifdef HAVE_HW_CRC
    const char *crc_kind = crc_impl == crc_hardware ? "sse4.2" : "slice-by-8";
#else
    const char *crc_kind = crc_impl == crc_software ? "slice-by-8" : "bytewise";
#endif
    if (PyModule_AddStringConstant(module, "CRC32C_IMPLEMENTATION", crc_kind) < 0
            || PyType_Ready(&ColumnBuffersType) < 0
            || PyModule_AddObjectRef(module, "ColumnBuffers", (PyObject *)&ColumnBuffersType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
