// stream: the C source and sink of benchkcapture -stream.
//
//   stream sink PATH                       listen on PATH, accept one client, read until EOF,
//                                          print the bytes read
//   stream source PATH RATE SECONDS SIZE   connect to PATH, write SIZE-byte buffers for SECONDS at
//                                          RATE bytes/s (0: as fast as the socket takes them),
//                                          print the bytes written
//
// Plain blocking write(2)/read(2) on the socket, as a C program without a runtime does: the
// kernel capture sees exactly one syscall per buffer.
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int sock(const char *path, struct sockaddr_un *a)
{
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (fd < 0 || strlen(path) >= sizeof(a->sun_path)) {
		perror("socket");
		exit(1);
	}
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	strcpy(a->sun_path, path);
	return fd;
}

int main(int argc, char **argv)
{
	struct sockaddr_un a;
	if (argc == 3 && strcmp(argv[1], "sink") == 0) {
		int l = sock(argv[2], &a);
		if (bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1)) {
			perror("listen");
			return 1;
		}
		printf("ready\n");
		fflush(stdout);
		int fd = accept(l, 0, 0);
		if (fd < 0) {
			perror("accept");
			return 1;
		}
		static char buf[1 << 20];
		long long total = 0;
		for (;;) {
			ssize_t n = read(fd, buf, sizeof(buf));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				break;
			total += n;
		}
		printf("%lld\n", total);
		return 0;
	}
	if (argc == 6 && strcmp(argv[1], "source") == 0) {
		double rate = atof(argv[3]), secs = atof(argv[4]);
		long size = atol(argv[5]);
		if (size <= 0 || size > (64 << 20) || secs <= 0 || secs > 600) {
			fprintf(stderr, "source: bad size or seconds\n");
			return 2;
		}
		int fd = sock(argv[2], &a);
		if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
			perror("connect");
			return 1;
		}
		char *buf = malloc(size);
		memset(buf, 'x', size);
		long long total = 0;
		double t0 = now(), end = t0 + secs;
		for (;;) {
			double t = now();
			if (t >= end)
				break;
			if (rate > 0) {
				double ahead = total / rate - (t - t0); /* seconds ahead of the schedule */
				if (ahead > 0) {
					struct timespec ts = {(time_t)ahead, (long)((ahead - (time_t)ahead) * 1e9)};
					nanosleep(&ts, 0);
					continue;
				}
			}
			ssize_t n = write(fd, buf, size);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				perror("write");
				return 1;
			}
			total += n;
		}
		double el = now() - t0;
		close(fd);
		printf("%lld %.6f\n", total, el);
		return 0;
	}
	fprintf(stderr, "usage: stream sink PATH | stream source PATH RATE SECONDS SIZE\n");
	return 2;
}
