/*
 * git-csi-tcp-relay HOST PORT: git's core.gitProxy for git:// remotes.
 *
 * git connects to a git:// remote without TCP_NODELAY, and a push writes its
 * ref commands and the flush after them in two writes: Nagle holds the flush
 * until the server acknowledges the commands, which a server delays by 40 ms,
 * on every push. git runs this program instead of connecting itself, talks
 * to it over stdin and stdout, and this relays both ways on a socket with
 * Nagle off. The other transports need nothing: curl sets TCP_NODELAY.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *host, *port;

static int fail(const char *what, int err) {
  fprintf(stderr, "git-csi-tcp-relay: %s %s:%s: %s\n", what, host, port, strerror(err));
  return 1;
}

/* The first address of HOST that accepts a connection, with Nagle off; -1 with errno set. */
static int dial(void) {
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *found, *ai;
  int rc = getaddrinfo(host, port, &hints, &found);
  if (rc != 0) {
    fprintf(stderr, "git-csi-tcp-relay: cannot resolve %s:%s: %s\n", host, port, gai_strerror(rc));
    return -2;
  }
  int fd = -1, err = ECONNREFUSED, one = 1;
  for (ai = found; ai != NULL && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      close(fd);
      fd = -1;
    } else if (fd < 0) {
      err = errno;
    }
  }
  freeaddrinfo(found);
  if (fd >= 0 && setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    err = errno;
    close(fd);
    fd = -1;
  }
  errno = err;
  return fd;
}

static int write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Copies what one side has to the other: 1 while it stays open, 0 at its end, -1 on an error. */
static int pass(int from, int to, char *buf, size_t size) {
  ssize_t n = read(from, buf, size);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return 1;
  if (n < 0) return -1;
  if (n == 0) return 0;
  return write_all(to, buf, (size_t)n) == 0 ? 1 : -1;
}

static int relay(int sock) {
  static char buf[65536];
  struct pollfd fds[2] = {{.fd = STDIN_FILENO, .events = POLLIN}, {.fd = sock, .events = POLLIN}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return fail("poll failed for", errno);
    }
    if (fds[0].revents != 0) {
      int open = pass(STDIN_FILENO, sock, buf, sizeof buf);
      if (open < 0) return fail("relaying to", errno);
      /* git sent all it will: the server sees the end, and its answer still comes back. */
      if (open == 0) {
        shutdown(sock, SHUT_WR);
        fds[0].fd = -1;
      }
    }
    if (fds[1].revents != 0) {
      int open = pass(sock, STDOUT_FILENO, buf, sizeof buf);
      /* git stopped reading: it has what it wanted. */
      if (open < 0 && errno == EPIPE) return 0;
      if (open < 0) return fail("relaying from", errno);
      if (open == 0) return 0;
    }
  }
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: git-csi-tcp-relay HOST PORT (git's core.gitProxy)\n");
    return 2;
  }
  host = argv[1];
  port = argv[2];
  signal(SIGPIPE, SIG_IGN);
  int sock = dial();
  if (sock == -2) return 1;
  if (sock < 0) return fail("cannot connect to", errno);
  return relay(sock);
}
