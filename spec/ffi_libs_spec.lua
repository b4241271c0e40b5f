-- Specs binding real C libraries through ums.ffi with declarations pasted
-- from their headers: sqlite3 (a database and statements returned through
-- out-parameters: open, prepare, bind, step, column reads, finalize,
-- close), zlib (a z_stream struct the library updates between calls,
-- deflate and inflate in a loop) and libc's getaddrinfo (a linked list of
-- struct addrinfo returned through an out-parameter). Each call is
-- preemptive, made from several tasks while a ticker task keeps ticking:
-- the ticks counted while the calls run show that the scheduler was not
-- blocked by them.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local ffi = ums.ffi
local C = ffi.C

-- From zlib.h (1.2.13), with its macros expanded.
ffi.cdef[[
typedef unsigned char Bytef;
typedef unsigned int uInt;
typedef unsigned long uLong;
typedef void *voidpf;
typedef voidpf (*alloc_func)(voidpf opaque, uInt items, uInt size);
typedef void (*free_func)(voidpf opaque, voidpf address);
struct internal_state;
typedef struct z_stream_s {
    const Bytef *next_in;
    uInt     avail_in;
    uLong    total_in;
    Bytef    *next_out;
    uInt     avail_out;
    uLong    total_out;
    const char *msg;
    struct internal_state *state;
    alloc_func zalloc;
    free_func  zfree;
    voidpf     opaque;
    int     data_type;
    uLong   adler;
    uLong   reserved;
} z_stream;
typedef z_stream *z_streamp;
enum { Z_NO_FLUSH = 0, Z_FINISH = 4, Z_OK = 0, Z_STREAM_END = 1,
       Z_BUF_ERROR = -5 };
const char *zlibVersion(void);
int deflateInit_(z_streamp strm, int level, const char *version,
                 int stream_size);
int deflate(z_streamp strm, int flush);
int deflateEnd(z_streamp strm);
int inflateInit_(z_streamp strm, const char *version, int stream_size);
int inflate(z_streamp strm, int flush);
int inflateEnd(z_streamp strm);
]]

-- From netdb.h, sys/socket.h and netinet/in.h (glibc 2.36, x86-64 and
-- AArch64; sin_zero's size expression evaluated: cdef's constant
-- expressions have no sizeof).
ffi.cdef[[
typedef unsigned int socklen_t;
typedef unsigned short int sa_family_t;
typedef uint16_t in_port_t;
typedef uint32_t in_addr_t;
struct sockaddr { sa_family_t sa_family; char sa_data[14]; };
struct in_addr { in_addr_t s_addr; };
struct sockaddr_in {
  sa_family_t sin_family;
  in_port_t sin_port;
  struct in_addr sin_addr;
  unsigned char sin_zero[8];
};
struct addrinfo {
  int ai_flags;
  int ai_family;
  int ai_socktype;
  int ai_protocol;
  socklen_t ai_addrlen;
  struct sockaddr *ai_addr;
  char *ai_canonname;
  struct addrinfo *ai_next;
};
extern int getaddrinfo (const char *__restrict __name,
                        const char *__restrict __service,
                        const struct addrinfo *__restrict __req,
                        struct addrinfo **__restrict __pai);
extern void freeaddrinfo (struct addrinfo *__ai) __attribute__ ((__nothrow__));
uint16_t ntohs(uint16_t);
uint32_t ntohl(uint32_t);
]]

local AF_INET, SOCK_STREAM = 2, 1

-- From sqlite3.h (3.40), the calls a query needs.
ffi.cdef[[
typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;
typedef long long sqlite3_int64;
enum { SQLITE_OK = 0, SQLITE_ROW = 100, SQLITE_DONE = 101 };
int sqlite3_open(const char *filename, sqlite3 **ppDb);
int sqlite3_close(sqlite3 *);
int sqlite3_exec(sqlite3 *, const char *sql, void *callback, void *arg,
                 char **errmsg);
int sqlite3_prepare_v2(sqlite3 *db, const char *zSql, int nByte,
                       sqlite3_stmt **ppStmt, const char **pzTail);
int sqlite3_bind_int(sqlite3_stmt *, int, int);
int sqlite3_step(sqlite3_stmt *);
int sqlite3_column_int(sqlite3_stmt *, int iCol);
sqlite3_int64 sqlite3_column_int64(sqlite3_stmt *, int iCol);
const unsigned char *sqlite3_column_text(sqlite3_stmt *, int iCol);
int sqlite3_finalize(sqlite3_stmt *pStmt);
const char *sqlite3_errmsg(sqlite3 *);
]]

local sqlok, sqlite = pcall(ffi.load, "sqlite3")
if not sqlok then sqlok, sqlite = pcall(ffi.load, "libsqlite3.so.0") end

local zok, z = pcall(ffi.load, "z")
if not zok then zok, z = pcall(ffi.load, "libz.so.1") end

-- body as the first task of a run, with `tasks` tasks each running work(i)
-- while a ticker ticks every millisecond. Fails unless the ticker ticked
-- while the calls were running (between the first task's start and the
-- last one's end).
local function with_ticker(tasks, work)
  ums.test(function()
    local ticks, running = 0, 0
    local stop = false
    local ticker = ums.spawn(function()
      while not stop do
        if running > 0 then ticks = ticks + 1 end
        ums.sleep(0.001)
      end
    end)
    ums.yield()
    local ts = {}
    for i = 1, tasks do
      ts[i] = ums.spawn(function()
        running = running + 1
        local ok, err = pcall(work, i)
        running = running - 1
        assert(ok, err)
        return true
      end)
    end
    for i = 1, tasks do
      local ok, err = ts[i]:join(60)
      assert(ok, err)
    end
    stop = true
    assert.is_true(ticker:join(5))
    assert.is_true(ticks > 0, "the ticker never ran during the calls")
  end, 90)
end

-- Some compressible data: n bytes of words with a little noise.
local function sample(n, seed)
  local words = {"alpha", "beta", "gamma", "delta", "ums", "zlib", "task"}
  local parts, len, x = {}, 0, seed
  while len < n do
    x = (x * 1103515245 + 12345) % 2147483648
    local w = words[x % #words + 1] .. (x % 97)
    parts[#parts + 1] = w
    len = len + #w + 1
  end
  return table.concat(parts, " "):sub(1, n)
end

local CHUNK = 16384

-- zlib's canonical loop: feed the input a chunk at a time, drain the
-- output a chunk at a time, until the stream ends.
local function zpipe(data, init, step, finish, deflating)
  local strm = ffi.new("z_stream")
  local inbuf = ffi.new("uint8_t[?]", CHUNK)
  local outbuf = ffi.new("uint8_t[?]", CHUNK)
  assert.equal(C.Z_OK, init(strm))
  local out, pos, rc = {}, 1, C.Z_OK
  repeat
    local piece = data:sub(pos, pos + CHUNK - 1)
    pos = pos + #piece
    if #piece > 0 then ffi.copy(inbuf, piece, #piece) end
    strm.next_in = inbuf
    strm.avail_in = #piece
    local flush = (deflating and pos > #data) and C.Z_FINISH or C.Z_NO_FLUSH
    repeat
      strm.next_out = outbuf
      strm.avail_out = CHUNK
      rc = step(strm, flush)
      assert(rc == C.Z_OK or rc == C.Z_STREAM_END or rc == C.Z_BUF_ERROR,
             "zlib returned " .. rc)
      local n = CHUNK - strm.avail_out
      if n > 0 then out[#out + 1] = ffi.string(outbuf, n) end
    until strm.avail_out ~= 0
  until rc == C.Z_STREAM_END or pos > #data and not deflating
  assert.equal(C.Z_STREAM_END, rc)
  assert.equal(#data, strm.total_in)
  assert.equal(C.Z_OK, finish(strm))
  return table.concat(out)
end

describe("ums.ffi with real libraries", function()
  it("zlib: deflate and inflate round trips from 4 tasks", function()
    assert(zok, "libz.so.1 is not installed: " .. tostring(z))
    local version = z.zlibVersion()
    local size = ffi.sizeof("z_stream")
    with_ticker(4, function(i)
      for round = 1, 3 do
        local data = sample(200000 + 37000 * i + round, i * 7 + round)
        local packed = zpipe(data,
          function(s) return z.deflateInit_(s, 6, version, size) end,
          z.deflate, z.deflateEnd, true)
        assert.is_true(#packed < #data // 2)
        local unpacked = zpipe(packed,
          function(s) return z.inflateInit_(s, version, size) end,
          z.inflate, z.inflateEnd, false)
        assert.equal(#data, #unpacked)
        assert.is_true(data == unpacked, "round trip differs")
      end
    end)
  end)

  it("getaddrinfo: walks its list of struct addrinfo from 6 tasks",
     function()
    with_ticker(6, function(i)
      local host = i % 2 == 0 and "localhost" or "127.0.0.1"
      for _ = 1, 10 do
        local hints = ffi.new("struct addrinfo",
                              {ai_family = AF_INET,
                               ai_socktype = SOCK_STREAM})
        local res = ffi.new("struct addrinfo *[1]")
        assert.equal(0, C.getaddrinfo(host, tostring(8000 + i), hints, res))
        assert.is_not_nil(res[0])
        local n, seen = 0, false
        -- Walked as LuaJIT code does: res[0] and ai.ai_next read as
        -- struct addrinfo pointers.
        local ai = res[0]
        while ai do
          n = n + 1
          assert.equal(AF_INET, ai.ai_family)
          assert.equal(SOCK_STREAM, ai.ai_socktype)
          assert.equal(ffi.sizeof("struct sockaddr_in"), ai.ai_addrlen)
          local sin = ffi.cast("struct sockaddr_in *", ai.ai_addr)
          assert.equal(AF_INET, sin.sin_family)
          assert.equal(8000 + i, C.ntohs(sin.sin_port))
          if C.ntohl(sin.sin_addr.s_addr) == 0x7f000001 then seen = true end
          ai = ai.ai_next
        end
        assert.is_true(n >= 1)
        assert.is_true(seen, host .. " did not resolve to 127.0.0.1")
        C.freeaddrinfo(res[0])
      end
    end)
  end)

  it("sqlite3: open, prepare, bind, step, column reads, finalize and close "
     .. "from several tasks while a ticker ticks", function()
    if not sqlok then
      pending("libsqlite3 is not installed: " .. tostring(sqlite))
      return
    end
    local C3 = sqlite
    with_ticker(4, function(i)
      local db = ffi.new("sqlite3 *[1]")
      assert.equal(C3.SQLITE_OK, C3.sqlite3_open(":memory:", db))
      local function exec(sql)
        local rc = C3.sqlite3_exec(db[0], sql, nil, nil, nil)
        assert(rc == C3.SQLITE_OK, C3.sqlite3_errmsg(db[0]))
      end
      exec("CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT)")
      exec("BEGIN")
      for k = 1, 200 do
        exec(("INSERT INTO t VALUES(%d, 'task %d row %d')"):format(k, i, k))
      end
      exec("COMMIT")
      local stmt = ffi.new("sqlite3_stmt *[1]")
      assert.equal(C3.SQLITE_OK, C3.sqlite3_prepare_v2(db[0],
        "SELECT k, v, k * k FROM t WHERE k > ? ORDER BY k", -1, stmt, nil))
      assert.equal(C3.SQLITE_OK, C3.sqlite3_bind_int(stmt[0], 1, 150))
      local rows = 0
      while true do
        local rc = C3.sqlite3_step(stmt[0])
        if rc == C3.SQLITE_DONE then break end
        assert.equal(C3.SQLITE_ROW, rc)
        rows = rows + 1
        local k = C3.sqlite3_column_int(stmt[0], 0)
        assert.equal(150 + rows, k)
        assert.equal(("task %d row %d"):format(i, k),
                     C3.sqlite3_column_text(stmt[0], 1))
        assert.equal(k * k, C3.sqlite3_column_int64(stmt[0], 2))
      end
      assert.equal(50, rows)
      assert.equal(C3.SQLITE_OK, C3.sqlite3_finalize(stmt[0]))
      assert.equal(C3.SQLITE_OK, C3.sqlite3_close(db[0]))
    end)
  end)
end)
