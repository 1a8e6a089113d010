/* Minimal kernel type definitions for udskit's unix-socket capture.
 *
 * Only the fields the program reads are declared. preserve_access_index makes
 * clang emit CO-RE relocations, so libbpf-style loaders (cilium/ebpf) fix the
 * offsets against the running kernel's BTF (/sys/kernel/btf/vmlinux) at load
 * time: the layout below does not have to match any particular kernel.
 */
#ifndef UDSKIT_KERNEL_TYPES_H
#define UDSKIT_KERNEL_TYPES_H

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct super_block {
	unsigned int s_dev;
};

struct inode {
	unsigned short i_mode;
	unsigned long i_ino;
	struct super_block *i_sb;
};

struct dentry {
	struct inode *d_inode;
};

struct path {
	void *mnt;
	struct dentry *dentry;
};

struct file {
	struct inode *f_inode;
	void *private_data;
};

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
};

struct files_struct {
	struct fdtable *fdt;
};

/* The thread's read and write syscalls (read, readv, write, writev: one
 * each, sockets included); CONFIG_TASK_XACCT only. */
struct task_io_accounting {
	unsigned long long syscr;
	unsigned long long syscw;
};

struct task_struct {
	struct files_struct *files;
	struct task_io_accounting ioac;
};

struct sock_common {
	unsigned short skc_family;
};

struct socket;

struct upid {
	int nr;
};

struct pid {
	struct upid numbers[1];
};

typedef struct {
	unsigned int val;
} kuid_t;

typedef struct {
	unsigned int val;
} kgid_t;

struct cred {
	kuid_t euid;
	kgid_t egid;
};

struct sock {
	struct sock_common __sk_common;
	struct socket *sk_socket;
	struct pid *sk_peer_pid;        /* SO_PEERCRED: the other end's process */
	const struct cred *sk_peer_cred;
};

struct socket {
	short type;
	struct file *file;
	struct sock *sk;
};

struct unix_sock {
	struct sock sk;
	struct path path;
	struct sock *peer;
};

struct msghdr;

#pragma clang attribute pop

#endif
