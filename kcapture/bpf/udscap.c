// SPDX-License-Identifier: (MIT OR GPL-2.0)
//go:build ignore

/* udskit kernel capture: record the bytes processes send and receive on unix
 * domain sockets, from syscall tracepoints.
 *
 * sys_enter_{write,writev,sendto,sendmsg,read,readv,recvfrom,recvmsg}: if the
 * fd is an AF_UNIX socket the configuration selects, remember the user buffer
 * (or iovec array) and the socket's identity under the thread id.
 * sys_exit_*: if the call moved ret > 0 bytes, copy up to snaplen of them in
 * chunks of at most CHUNK bytes into the ring buffer, each chunk carrying the
 * full header (so user space can reassemble and notice gaps). Every chunk the
 * ring buffer refuses, and every user-memory read that fails, is counted in
 * the per-cpu `stats` map: nothing is dropped silently.
 *
 * Regenerate the Go bindings and objects with `go generate ./kcapture` (needs
 * clang, llvm-strip and the libbpf headers: Debian `clang llvm libbpf-dev`).
 */

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "kernel_types.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

#define AF_UNIX 1
#define S_IFMT 00170000
#define S_IFSOCK 0140000
#define MSG_PEEK 2
#define SOL_SOCKET 1
#define SCM_RIGHTS 1

#define CHUNK 16384 /* power of two */
#define MAX_IOV 1024
#define MAX_CMSG 4

/* Selection modes (cfg_mode). */
#define MODE_ALL 0
#define MODE_PID 1
#define MODE_PATH 2

/* Configuration, fixed at load time (the verifier prunes unused modes). */
volatile const __u32 cfg_mode = MODE_ALL;
volatile const __u32 cfg_tgid = 0;
volatile const __u64 cfg_vfs_ino = 0; /* bound file of the selected socket path */
volatile const __u32 cfg_vfs_dev = 0; /* its device, kernel encoding (major<<20|minor) */
volatile const __u32 cfg_snaplen = 65536;
volatile const __u32 cfg_self = 0; /* our own tgid: never captured */
/* Wake the reader only when this much is waiting: it polls every few
 * milliseconds anyway, and a wakeup per record would cost the traced
 * processes a context switch each on a busy machine. */
volatile const __u64 cfg_wake_bytes = 1 << 20;
/* Record receives even when the sender's writes are recorded too (each byte
 * then twice): for senders that write with syscalls not traced here
 * (splice, sendfile, io_uring). */
volatile const __u32 cfg_both_sides = 0;

/* Syscall kinds. */
enum {
	K_WRITE = 1,
	K_WRITEV,
	K_SENDTO,
	K_SENDMSG,
	K_READ,
	K_READV,
	K_RECVFROM,
	K_RECVMSG,
};

/* Header flags. */
#define F_OWN_BOUND 1   /* this end has a bound name (a listener's accepted end has its name) */
#define F_PEER_BOUND 2  /* the peer has a bound name */
#define F_FAULT 4       /* user memory could not be read: this chunk has no data */
#define F_RECV 8        /* data received (read side); otherwise sent */
#define F_EOF 16        /* a stream read returned 0: the peer finished sending */
#define F_RESET 32      /* a stream read failed with ECONNRESET */

#define SOCK_STREAM 1
#define SOCK_SEQPACKET 5
#define ECONNRESET 104

/* One ring-buffer record: this header then `chunk` bytes of data. Keep in
 * sync with rawHeader in event.go. */
struct event {
	__u64 ts;       /* CLOCK_MONOTONIC ns: send entry or receive exit */
	__u64 sk;       /* this end's struct sock (identity only) */
	__u64 peer;     /* the peer's struct sock, 0 if none */
	__u64 ino;      /* this end's socket inode (as /proc/net/unix, ss -x) */
	__u64 peer_ino; /* the peer's socket inode, 0 if unknown */
	__u32 tgid;
	__u32 tid;
	__u32 uid;
	__u32 gid;
	__u32 fd;
	__u32 len;   /* bytes the syscall moved */
	__u32 off;   /* offset of this chunk in those bytes */
	__u32 chunk; /* data bytes following the header */
	__u16 nfds;  /* fds passed with SCM_RIGHTS in this message */
	__u8 sotype; /* SOCK_STREAM 1, SOCK_DGRAM 2, SOCK_SEQPACKET 5 */
	__u8 flags;
	__u8 kind;
	__u8 pad[3];
	char comm[16];
	__u32 peer_pid; /* SO_PEERCRED of this end: the other end's pid, 0 if none */
	__u32 peer_uid;
	__u32 peer_gid;
	__u32 bound_dev; /* the bound socket file of this end, else of the peer: */
	__u64 bound_ino; /* its device (kernel encoding) and inode, 0 if neither is bound */
	/* Bytes this socket had sent (or received) before this message, since
	 * the capture first saw it: user space finds whole messages the ring
	 * buffer dropped as gaps. */
	__u64 stream_off;
};

struct scratch {
	struct event hdr;
	__u8 data[CHUNK];
};

/* A full 64 KiB chunk, reserved in the ring buffer (too large for a
 * per-cpu scratch value). */
#define BIG 65536
struct big {
	struct event hdr;
	__u8 data[BIG];
};

/* What sys_enter saw, for sys_exit. */
struct pending {
	__u64 ts;     /* at sys_enter: the time of a send */
	__u64 buf;    /* user buffer, or iovec array when iovcnt > 0 */
	__u64 iovcnt; /* 0: buf is a plain buffer */
	__u64 msg;    /* user msghdr for recvmsg (control read at exit) */
	__u64 sk, peer, ino, peer_ino;
	__u32 peer_pid, peer_uid, peer_gid;
	__u64 bound_ino;
	__u32 bound_dev;
	__u32 fd;
	__u16 nfds;
	__u8 sotype;
	__u8 flags;
	__u8 kind;
	__u8 skip_data; /* a receive whose bytes the sender's write records */
	__u64 vfs_n;    /* read, readv, write, writev: the thread's count of those
	                   (vfs_calls) this syscall's exit must see; 0: not checked */
};

/* Statistics, per cpu (summed by user space). Keep in sync with stats.go. */
enum {
	S_CHUNKS = 0,   /* chunks delivered */
	S_LOST_CHUNKS,  /* ring buffer full */
	S_LOST_BYTES,
	S_FAULTS,       /* user memory unreadable */
	S_FAULT_BYTES,
	S_PENDING_FULL, /* pending map full: a syscall not recorded */
	S_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20); /* resized by user space */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, S_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536); /* threads inside a selected syscall at once */
	__type(key, __u64);
	__type(value, struct pending);
} pending_map SEC(".maps");

/* Byte counters per socket and direction, by the socket's inode (key:
 * ino << 1, | 1 for received): the inode, unlike the struct sock's
 * address, is not reused by the next socket once this one is freed. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u64);
} streams SEC(".maps");

/* The identity of connected stream and seqpacket sockets, by (tgid, fd):
 * their peer, credentials and bound names are fixed once connected, so a
 * syscall on a known fd reads the fd table and the file's inode number
 * (to tell a reused fd or file) instead of resolving the socket again. */
struct fdkey {
	__u32 tgid;
	__u32 fd;
};

struct fdident {
	__u64 file;     /* the struct file the identity was read from */
	__u64 file_ino; /* its inode number: a reused struct file differs */
	struct pending p;
	__u32 selected;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct fdkey);
	__type(value, struct fdident);
} fdcache SEC(".maps");

/* stream_advance returns the byte count of the socket with inode ino
 * before this message and adds n to it. */
static __always_inline __u64 stream_advance(__u64 ino, int recv, __u64 n)
{
	__u64 key = ino << 1 | (recv ? 1 : 0);
	__u64 *v = bpf_map_lookup_elem(&streams, &key);
	if (!v) {
		__u64 zero = 0;
		bpf_map_update_elem(&streams, &key, &zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&streams, &key);
		if (!v)
			return 0;
	}
	return __sync_fetch_and_add(v, n);
}

/* Wake the reader only when this record takes the data waiting across
 * cfg_wake_bytes: once per time the reader falls that far behind, not on
 * every record after (each wakeup is an interrupt on the writer's CPU).
 * A reader that sleeps found the ring empty, so the crossing comes. */
static __always_inline __u64 rb_flags(__u64 size)
{
	__u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	return avail < cfg_wake_bytes && avail + size >= cfg_wake_bytes ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

static __always_inline void stat_add(__u32 idx, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);
	if (v)
		*v += n;
}

/* Bound file of a unix socket: true if it is the configured socket path. */
static __always_inline int bound_to_cfg(struct unix_sock *u)
{
	struct inode *vi = BPF_CORE_READ(u, path.dentry, d_inode);
	if (!vi)
		return 0;
	if (BPF_CORE_READ(vi, i_ino) != cfg_vfs_ino)
		return 0;
	return BPF_CORE_READ(vi, i_sb, s_dev) == cfg_vfs_dev;
}

static __always_inline __u64 sock_ino(struct sock *sk)
{
	return BPF_CORE_READ(sk, sk_socket, file, f_inode, i_ino);
}

/* unix_fd_slow resolves the socket behind file f: 1 selected (p filled),
 * 0 an AF_UNIX socket not selected (p->peer and p->sotype filled), -1 not
 * an AF_UNIX socket. */
static __always_inline int unix_fd_slow(__u32 fd, struct file *f, struct inode *ino, struct pending *p)
{
	struct socket *sock = BPF_CORE_READ(f, private_data);
	if (!sock)
		return -1;
	struct sock *sk = BPF_CORE_READ(sock, sk);
	if (!sk || BPF_CORE_READ(sk, __sk_common.skc_family) != AF_UNIX)
		return -1;
	struct unix_sock *u = (struct unix_sock *)sk;
	struct sock *peer = BPF_CORE_READ(u, peer);

	if (cfg_mode == MODE_PATH) {
		if (!bound_to_cfg(u) && !(peer && bound_to_cfg((struct unix_sock *)peer))) {
			p->peer = (__u64)peer;
			p->sotype = BPF_CORE_READ(sock, type);
			return 0;
		}
	}

	p->fd = fd;
	p->sk = (__u64)sk;
	p->peer = (__u64)peer;
	p->ino = BPF_CORE_READ(ino, i_ino);
	p->peer_ino = peer ? sock_ino(peer) : 0;
	p->sotype = BPF_CORE_READ(sock, type);
	/* The credentials SO_PEERCRED reports: the other end's process when it
	 * connected (or listened), valid even after that end is gone. */
	struct pid *pp = BPF_CORE_READ(sk, sk_peer_pid);
	p->peer_pid = pp ? BPF_CORE_READ(pp, numbers[0].nr) : 0;
	const struct cred *pc = BPF_CORE_READ(sk, sk_peer_cred);
	if (pc) {
		p->peer_uid = BPF_CORE_READ(pc, euid.val);
		p->peer_gid = BPF_CORE_READ(pc, egid.val);
	}
	p->flags = 0;
	struct inode *vi = BPF_CORE_READ(u, path.dentry, d_inode);
	if (vi)
		p->flags |= F_OWN_BOUND;
	if (peer) {
		struct inode *pvi = BPF_CORE_READ((struct unix_sock *)peer, path.dentry, d_inode);
		if (pvi) {
			p->flags |= F_PEER_BOUND;
			if (!vi)
				vi = pvi;
		}
	}
	if (vi) {
		p->bound_ino = BPF_CORE_READ(vi, i_ino);
		p->bound_dev = BPF_CORE_READ(vi, i_sb, s_dev);
	}
	return 1;
}

/* Fill p from fd if it is a selected AF_UNIX socket; 0 if not. */
static __always_inline int unix_fd(__u32 fd, struct pending *p)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt)
		return 0;
	if (fd >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = 0;
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
		return 0;
	struct inode *ino = BPF_CORE_READ(f, f_inode);
	if (!ino || (BPF_CORE_READ(ino, i_mode) & S_IFMT) != S_IFSOCK)
		return 0;
	__u64 file_ino = BPF_CORE_READ(ino, i_ino);
	struct fdkey key = {.tgid = bpf_get_current_pid_tgid() >> 32, .fd = fd};
	struct fdident *hit = bpf_map_lookup_elem(&fdcache, &key);
	if (hit && hit->file == (__u64)f && hit->file_ino == file_ino) {
		if (!hit->selected)
			return 0;
		__builtin_memcpy(p, &hit->p, sizeof(*p));
		return 1;
	}
	int sel = unix_fd_slow(fd, f, ino, p);
	if (sel >= 0 && p->peer && (p->sotype == SOCK_STREAM || p->sotype == SOCK_SEQPACKET)) {
		struct fdident v = {.file = (__u64)f, .file_ino = file_ino, .selected = sel};
		__builtin_memcpy(&v.p, p, sizeof(*p));
		bpf_map_update_elem(&fdcache, &key, &v, BPF_ANY);
	}
	return sel > 0;
}

/* Cheap checks before touching the fd table. */
static __always_inline int want_task(__u64 pid_tgid)
{
	__u32 tgid = pid_tgid >> 32;
	if (tgid == cfg_self)
		return 0;
	if (cfg_mode == MODE_PID && tgid != cfg_tgid)
		return 0;
	return 1;
}

/* Count the fds of SCM_RIGHTS messages in a user control buffer. */
static __always_inline __u16 count_rights(__u64 control, __u64 controllen)
{
	__u16 n = 0;
	__u64 off = 0;
#pragma unroll
	for (int i = 0; i < MAX_CMSG; i++) {
		struct {
			__u64 len;
			int level;
			int type;
		} c;
		if (off + sizeof(c) > controllen)
			break;
		if (bpf_probe_read_user(&c, sizeof(c), (void *)(control + off)))
			break;
		if (c.len < sizeof(c) || off + c.len > controllen)
			break;
		if (c.level == SOL_SOCKET && c.type == SCM_RIGHTS)
			n += (c.len - sizeof(c)) / 4;
		off += (c.len + 7) & ~7ULL;
	}
	return n;
}

struct user_msghdr_ {
	__u64 name;
	int namelen;
	int pad;
	__u64 iov;
	__u64 iovlen;
	__u64 control;
	__u64 controllen;
	unsigned int flags;
};

/* peer_selected: the other end of this connected stream or seqpacket
 * socket is selected too, so its writes record the bytes this end reads.
 * The selection by path is symmetric (an end is selected when it or its
 * peer is bound to the path), and --all selects every process but ours
 * (SO_PEERCRED names the peer's). By pid it cannot be told: SO_PEERCRED
 * names the process that connected, and a socketpair shared across fork
 * names its creator at both ends, so the reads are kept. */
static __always_inline int peer_selected(struct pending *p)
{
	if (cfg_mode == MODE_PID)
		return 0;
	if (!p->peer || (p->sotype != SOCK_STREAM && p->sotype != SOCK_SEQPACKET))
		return 0;
	if (p->peer_pid == 0 || p->peer_pid == cfg_self)
		return 0;
	return 1;
}

/* forget drops the thread's pending entry, at the enter of a traced
 * syscall that is not recorded (an fd that is no selected socket, a
 * MSG_PEEK, no iovec): an entry the thread still holds then belongs to an
 * earlier syscall whose exit was missed, and this syscall's exit, of the
 * same kind (and, a socket closed and its number reused, the same fd),
 * would take it for its own (see pending_of). A lookup first: most such
 * syscalls find nothing to delete. */
static __always_inline int forget(__u64 id)
{
	if (bpf_map_lookup_elem(&pending_map, &id))
		bpf_map_delete_elem(&pending_map, &id);
	return 0;
}

/* vfs_calls returns the thread's count of read and readv (kind a
 * receive) or write and writev syscalls, each counted once just before it
 * returns (task io accounting: syscr, syscw), or 0 for the other kinds
 * and where the kernel does not count them (no CONFIG_TASK_XACCT). */
static __always_inline __u64 vfs_calls(__u8 kind)
{
	if (kind != K_WRITE && kind != K_WRITEV && kind != K_READ && kind != K_READV)
		return 0;
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	if (!bpf_core_field_exists(t->ioac.syscw))
		return 0;
	if (kind >= K_READ)
		return BPF_CORE_READ(t, ioac.syscr);
	return BPF_CORE_READ(t, ioac.syscw);
}

static __always_inline int on_enter(__u32 fd, __u64 buf, __u64 iovcnt, __u8 kind, __u64 msg)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!want_task(id))
		return 0;
	struct pending p = {};
	if (!unix_fd(fd, &p))
		return forget(id);
	p.ts = bpf_ktime_get_ns();
	p.kind = kind;
	if ((p.vfs_n = vfs_calls(kind)))
		p.vfs_n++; /* this syscall counts itself before its exit */
	if (kind >= K_READ && !cfg_both_sides && peer_selected(&p))
		p.skip_data = 1;
	p.buf = buf;
	p.iovcnt = iovcnt;
	if (msg) {
		struct user_msghdr_ m;
		if (bpf_probe_read_user(&m, sizeof(m), (void *)msg))
			return forget(id);
		p.buf = m.iov;
		p.iovcnt = m.iovlen;
		if (kind == K_SENDMSG && m.control && m.controllen)
			p.nfds = count_rights(m.control, m.controllen);
		if (kind == K_RECVMSG)
			p.msg = msg;
	}
	if (bpf_map_update_elem(&pending_map, &id, &p, BPF_ANY)) {
		stat_add(S_PENDING_FULL, 1);
		forget(id);
	}
	return 0;
}

struct loopctx {
	__u64 iov;       /* user iovec array, 0 for one buffer */
	__u64 buf;       /* current user pointer */
	__u64 buflen;    /* bytes left in the current buffer */
	__u32 iovidx;
	__u32 iovcnt;
	__u32 remaining; /* bytes still to record */
	__u32 off;
};

static long emit_chunk(__u32 i, void *arg)
{
	struct loopctx *c = arg;
	if (c->remaining == 0)
		return 1;
	if (c->buflen == 0) {
		if (!c->iov || c->iovidx >= c->iovcnt || c->iovidx >= MAX_IOV)
			return 1;
		struct {
			__u64 base;
			__u64 len;
		} v;
		if (bpf_probe_read_user(&v, sizeof(v), (void *)(c->iov + (__u64)c->iovidx * 16)))
			v.base = 0, v.len = c->remaining; /* count the rest as faulted below */
		c->iovidx++;
		c->buf = v.base;
		c->buflen = v.len;
		return 0;
	}
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_map, &zero);
	if (!s)
		return 1;
	__u64 n = c->buflen;
	if (n > c->remaining)
		n = c->remaining;
	if (n >= BIG)
		n = BIG;
	else if (n > CHUNK)
		n = CHUNK;
	s->hdr.off = c->off;
	s->hdr.flags &= ~F_FAULT;
	s->hdr.chunk = n; /* bytes of the stream this chunk covers */
	int unreadable = 0;
	/* Full chunks are read from user memory straight into the ring
	 * buffer: one copy of the bytes less than through scratch; a 64 KiB
	 * write is one record, which user space can write out in place. */
	if (n == BIG && c->buf) {
		struct big *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
		if (!r) {
			stat_add(S_LOST_CHUNKS, 1);
			stat_add(S_LOST_BYTES, n);
			goto advance;
		}
		__builtin_memcpy(&r->hdr, &s->hdr, sizeof(r->hdr));
		if (!bpf_probe_read_user(r->data, BIG, (void *)c->buf)) {
			bpf_ringbuf_submit(r, rb_flags(sizeof(*r)));
			stat_add(S_CHUNKS, 1);
			goto advance;
		}
		bpf_ringbuf_discard(r, BPF_RB_NO_WAKEUP);
		unreadable = 1; /* recorded below as a fault, header only */
	} else if (n == CHUNK && c->buf) {
		struct scratch *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
		if (!r) {
			stat_add(S_LOST_CHUNKS, 1);
			stat_add(S_LOST_BYTES, n);
			goto advance;
		}
		__builtin_memcpy(&r->hdr, &s->hdr, sizeof(r->hdr));
		if (!bpf_probe_read_user(r->data, CHUNK, (void *)c->buf)) {
			bpf_ringbuf_submit(r, rb_flags(sizeof(*r)));
			stat_add(S_CHUNKS, 1);
			goto advance;
		}
		bpf_ringbuf_discard(r, BPF_RB_NO_WAKEUP);
		unreadable = 1;
	}
	__u64 out = n;
	if (out > CHUNK)
		out = CHUNK;
	if (unreadable || !c->buf || bpf_probe_read_user(s->data, out, (void *)c->buf)) {
		stat_add(S_FAULTS, 1);
		stat_add(S_FAULT_BYTES, n);
		s->hdr.flags |= F_FAULT;
		out = 0;
	}
	if (out > CHUNK)
		out = CHUNK;
	if (bpf_ringbuf_output(&events, s, sizeof(s->hdr) + out, rb_flags(sizeof(s->hdr) + out))) {
		stat_add(S_LOST_CHUNKS, 1);
		stat_add(S_LOST_BYTES, n);
	} else {
		stat_add(S_CHUNKS, 1);
	}
advance:
	c->buf += n;
	c->buflen -= n;
	c->remaining -= n;
	c->off += n;
	return 0;
}

/* pending_of returns the thread's pending entry if it belongs to the
 * syscall now exiting (of this kind; raw_exit checks the fd too); an entry
 * of another syscall is deleted. An entry whose own exit was never seen (the
 * sys_exit program not attached yet when the syscall entered, or a run the
 * kernel skipped) must not be taken for a later syscall's: its stale
 * buffer would be recorded with that syscall's return value as its length
 * (a 1-byte "message" from an 8-byte write's buffer, after a syscall that
 * returned 1).
 *
 * The kind alone cannot tell a later syscall of the same kind on another fd
 * (the per-syscall exit tracepoint has no fd): that syscall's enter ran just
 * before this exit, on this thread, and it either replaced the entry with
 * its own or, not recorded, deleted it (forget). So an entry found here of
 * this kind is this syscall's, unless that enter's run was skipped too (two
 * runs missed in a row on one thread). For read, readv, write and writev
 * that case is caught too: each counts itself once in the thread's io
 * accounting (syscr, syscw) before it returns, so the count at this exit is
 * the entry's vfs_n (its enter's count + 1) only for the entry's own
 * syscall. sendto, sendmsg, recvfrom and recvmsg are not counted there:
 * for them the two-runs gap remains. */
static __always_inline struct pending *pending_of(__u64 id, __u8 kind)
{
	struct pending *p = bpf_map_lookup_elem(&pending_map, &id);
	if (!p)
		return 0;
	if (p->kind != kind || (p->vfs_n && p->vfs_n != vfs_calls(kind))) {
		bpf_map_delete_elem(&pending_map, &id);
		return 0;
	}
	return p;
}

/* on_exit records what the syscall of p (the thread's pending entry, see
 * pending_of) moved. */
static __always_inline int on_exit(__u64 id, struct pending *p, long ret)
{
	__u8 end = 0;
	if (ret <= 0) {
		/* On a stream socket a read of 0 is the peer's EOF and ECONNRESET
		 * a reset: both end a direction of the flow. */
		if (p->kind >= K_READ && p->sotype == SOCK_STREAM && ret == 0)
			end = F_EOF;
		else if (p->kind >= K_READ && p->sotype == SOCK_STREAM && ret == -ECONNRESET)
			end = F_RESET;
		if (!end) {
			bpf_map_delete_elem(&pending_map, &id);
			return 0;
		}
		ret = 0;
	} else if (p->skip_data) {
		/* Recorded once, from the sender's write. */
		bpf_map_delete_elem(&pending_map, &id);
		return 0;
	}
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_map, &zero);
	if (!s) {
		bpf_map_delete_elem(&pending_map, &id);
		return 0;
	}
	struct event *e = &s->hdr;
	/* A send is stamped when it began and a receive when it ended, so the
	 * receive of some bytes never precedes their send. */
	e->ts = p->kind >= K_READ ? bpf_ktime_get_ns() : p->ts;
	e->sk = p->sk;
	e->peer = p->peer;
	e->ino = p->ino;
	e->peer_ino = p->peer_ino;
	e->tgid = id >> 32;
	e->tid = (__u32)id;
	__u64 ug = bpf_get_current_uid_gid();
	e->uid = (__u32)ug;
	e->gid = ug >> 32;
	e->fd = p->fd;
	e->peer_pid = p->peer_pid;
	e->peer_uid = p->peer_uid;
	e->peer_gid = p->peer_gid;
	e->bound_ino = p->bound_ino;
	e->bound_dev = p->bound_dev;
	e->len = ret;
	e->stream_off = ret > 0 ? stream_advance(p->ino, p->kind >= K_READ, ret) : 0;
	e->nfds = p->nfds;
	e->sotype = p->sotype;
	e->flags = p->flags;
	e->kind = p->kind;
	if (p->kind >= K_READ)
		e->flags |= F_RECV;
	e->flags |= end;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	if (p->kind == K_RECVMSG && p->msg) {
		struct user_msghdr_ m;
		if (!bpf_probe_read_user(&m, sizeof(m), (void *)p->msg) && m.control && m.controllen)
			e->nfds = count_rights(m.control, m.controllen);
	}

	struct loopctx c = {};
	__u64 want = ret;
	if (want > cfg_snaplen)
		want = cfg_snaplen;
	c.remaining = want;
	if (p->iovcnt) {
		c.iov = p->buf;
		c.iovcnt = p->iovcnt > MAX_IOV ? MAX_IOV : p->iovcnt;
	} else {
		c.buf = p->buf;
		c.buflen = want;
	}
	bpf_map_delete_elem(&pending_map, &id);
	if (want == 0) {
		/* an end of stream, or snaplen 0: the header only */
		e->off = 0;
		e->chunk = 0;
		if (bpf_ringbuf_output(&events, s, sizeof(s->hdr), rb_flags(sizeof(s->hdr))))
			stat_add(S_LOST_CHUNKS, 1);
		else
			stat_add(S_CHUNKS, 1);
		return 0;
	}
	bpf_loop(want / CHUNK + c.iovcnt + 2, emit_chunk, &c, 0);
	return 0;
}

/* Tracepoint contexts of syscalls/sys_enter_* and sys_exit_*. */
struct sys_enter_ctx {
	__u64 common;
	long nr;
	unsigned long args[6];
};

struct sys_exit_ctx {
	__u64 common;
	long nr;
	long ret;
};

SEC("tracepoint/syscalls/sys_enter_write")
int enter_write(struct sys_enter_ctx *ctx) { return on_enter(ctx->args[0], ctx->args[1], 0, K_WRITE, 0); }
SEC("tracepoint/syscalls/sys_enter_read")
int enter_read(struct sys_enter_ctx *ctx) { return on_enter(ctx->args[0], ctx->args[1], 0, K_READ, 0); }
SEC("tracepoint/syscalls/sys_enter_writev")
int enter_writev(struct sys_enter_ctx *ctx)
{
	if (ctx->args[2] == 0)
		return forget(bpf_get_current_pid_tgid());
	return on_enter(ctx->args[0], ctx->args[1], ctx->args[2], K_WRITEV, 0);
}
SEC("tracepoint/syscalls/sys_enter_readv")
int enter_readv(struct sys_enter_ctx *ctx)
{
	if (ctx->args[2] == 0)
		return forget(bpf_get_current_pid_tgid());
	return on_enter(ctx->args[0], ctx->args[1], ctx->args[2], K_READV, 0);
}
SEC("tracepoint/syscalls/sys_enter_sendto")
int enter_sendto(struct sys_enter_ctx *ctx) { return on_enter(ctx->args[0], ctx->args[1], 0, K_SENDTO, 0); }
SEC("tracepoint/syscalls/sys_enter_recvfrom")
int enter_recvfrom(struct sys_enter_ctx *ctx)
{
	if (ctx->args[3] & MSG_PEEK)
		return forget(bpf_get_current_pid_tgid());
	return on_enter(ctx->args[0], ctx->args[1], 0, K_RECVFROM, 0);
}
SEC("tracepoint/syscalls/sys_enter_sendmsg")
int enter_sendmsg(struct sys_enter_ctx *ctx) { return on_enter(ctx->args[0], 0, 0, K_SENDMSG, ctx->args[1]); }
SEC("tracepoint/syscalls/sys_enter_recvmsg")
int enter_recvmsg(struct sys_enter_ctx *ctx)
{
	if (ctx->args[2] & MSG_PEEK)
		return forget(bpf_get_current_pid_tgid());
	return on_enter(ctx->args[0], 0, 0, K_RECVMSG, ctx->args[1]);
}

/* The per-syscall exit tracepoints know their syscall, not its fd (the
 * raw one reads both). */
static __always_inline int tp_exit(long ret, __u8 kind)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (cfg_mode == MODE_PID && !want_task(id))
		return 0;
	struct pending *p = pending_of(id, kind);
	if (!p)
		return 0;
	return on_exit(id, p, ret);
}

SEC("tracepoint/syscalls/sys_exit_write")
int exit_write(struct sys_exit_ctx *ctx) { return tp_exit(ctx->ret, K_WRITE); }
SEC("tracepoint/syscalls/sys_exit_read")
int exit_read(struct sys_exit_ctx *ctx) { return tp_exit(ctx->ret, K_READ); }
SEC("tracepoint/syscalls/sys_exit_writev")
int exit_writev(struct sys_exit_ctx *ctx) { return tp_exit(ctx->ret, K_WRITEV); }
SEC("tracepoint/syscalls/sys_exit_readv")
int exit_readv(struct sys_exit_ctx *ctx) { return tp_exit(ctx->ret, K_READV); }
SEC("tracepoint/syscalls/sys_exit_sendto")
int exit_sendto(struct sys_exit_ctx *ctx) { return tp_exit(ctx->ret, K_SENDTO); }
SEC("tracepoint/syscalls/sys_exit_recvfrom")
int exit_recvfrom(struct sys_exit_ctx *ctx) { return tp_exit(ctx->ret, K_RECVFROM); }
SEC("tracepoint/syscalls/sys_exit_sendmsg")
int exit_sendmsg(struct sys_exit_ctx *ctx) { return tp_exit(ctx->ret, K_SENDMSG); }
SEC("tracepoint/syscalls/sys_exit_recvmsg")
int exit_recvmsg(struct sys_exit_ctx *ctx) { return tp_exit(ctx->ret, K_RECVMSG); }

/* Raw syscall tracepoints (x86-64 only; user space sets the syscall numbers
 * and attaches these instead of the per-syscall tracepoints above where the
 * kernel allows): one program per direction for every syscall, cheaper per
 * traced call than the per-syscall tracepoints (no perf buffer). */
volatile const long nr_write = -1, nr_writev = -1, nr_sendto = -1, nr_sendmsg = -1;
volatile const long nr_read = -1, nr_readv = -1, nr_recvfrom = -1, nr_recvmsg = -1;

/* The x86-64 register frame (struct pt_regs): user ABI, fixed layout. */
struct x86_regs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, orig_ax;
};

/* nr_kind: the kind of syscall number nr, 0 if not traced. */
static __always_inline __u8 nr_kind(long nr)
{
	if (nr == nr_write)
		return K_WRITE;
	if (nr == nr_read)
		return K_READ;
	if (nr == nr_sendmsg)
		return K_SENDMSG;
	if (nr == nr_recvmsg)
		return K_RECVMSG;
	if (nr == nr_sendto)
		return K_SENDTO;
	if (nr == nr_recvfrom)
		return K_RECVFROM;
	if (nr == nr_writev)
		return K_WRITEV;
	if (nr == nr_readv)
		return K_READV;
	return 0;
}

SEC("raw_tracepoint/sys_enter")
int raw_enter(struct bpf_raw_tracepoint_args *ctx)
{
	__u8 kind = nr_kind(ctx->args[1]);
	if (!kind)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	if (!want_task(id))
		return 0;
	struct x86_regs r;
	if (bpf_probe_read_kernel(&r, sizeof(r), (void *)ctx->args[0]))
		return forget(id);
	/* syscall arguments: di, si, dx, r10. A syscall not recorded forgets
	 * the thread's entry: raw_exit drops a stale one at the next exit of
	 * any other syscall or fd, but a MSG_PEEK on its fd would match it. */
	switch (kind) {
	case K_WRITEV:
	case K_READV:
		if (r.dx == 0)
			return forget(id);
		return on_enter(r.di, r.si, r.dx, kind, 0);
	case K_SENDMSG:
		return on_enter(r.di, 0, 0, kind, r.si);
	case K_RECVMSG:
		if (r.dx & MSG_PEEK)
			return forget(id);
		return on_enter(r.di, 0, 0, kind, r.si);
	case K_RECVFROM:
		if (r.r10 & MSG_PEEK)
			return forget(id);
		return on_enter(r.di, r.si, 0, kind, 0);
	default:
		return on_enter(r.di, r.si, 0, kind, 0);
	}
}

/* sys_exit sees every syscall: the saved registers say which one exits
 * (orig_ax) and on which fd (di, the first argument), read only when the
 * thread has a pending entry; one of another syscall or fd, or of a read
 * or write counted before this one (vfs_n), is stale (see pending_of) and
 * deleted. */
SEC("raw_tracepoint/sys_exit")
int raw_exit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (cfg_mode == MODE_PID && !want_task(id))
		return 0;
	struct pending *p = bpf_map_lookup_elem(&pending_map, &id);
	if (!p)
		return 0;
	struct x86_regs r;
	if (bpf_probe_read_kernel(&r, sizeof(r), (void *)ctx->args[0]) ||
	    p->kind != nr_kind(r.orig_ax) || p->fd != (__u32)r.di ||
	    (p->vfs_n && p->vfs_n != vfs_calls(p->kind))) {
		bpf_map_delete_elem(&pending_map, &id);
		return 0;
	}
	return on_exit(id, p, ctx->args[1]);
}

/* Probe only: loads where BPF tracing (fentry) programs are allowed. udskit
 * tries it first and reports the kernel's answer. */
SEC("fentry/unix_stream_sendmsg")
int BPF_PROG(probe_fentry, struct socket *sock, struct msghdr *msg, __u64 len)
{
	return 0;
}
