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

/*
 * Ends the relay the way git's own connection would end: git reads the end
 * of its answer and exits on its own. Exiting at once could let git's next
 * write find the pipe closed, and SIGPIPE would end git without an exit
 * code; so what git still writes is read, to its end, and dropped.
 */
static int end(int code) {
  static char sink[4096];
  close(STDOUT_FILENO);
  for (;;) {
    ssize_t n = read(STDIN_FILENO, sink, sizeof sink);
    if (n > 0 || (n < 0 && errno == EINTR)) continue;
    return code;
  }
}

static int fail(const char *what, const char *why) {
  fprintf(stderr, "git-csi-tcp-relay: %s %s:%s: %s\n", what, host, port, why);
  return end(1);
}

/* The first address of HOST that accepts a connection, with Nagle off; -1 with the failure in *what and *why. */
static int dial(const char **what, const char **why) {
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *found, *ai;
  int rc = getaddrinfo(host, port, &hints, &found);
  if (rc != 0) {
    *what = "cannot resolve";
    *why = rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc);
    return -1;
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
  *what = "cannot connect to";
  *why = strerror(err);
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
  /* stdout is polled for nothing but its error: git gone (killed on a timeout) ends the relay, even while the server says nothing. */
  struct pollfd fds[3] = {{.fd = STDIN_FILENO, .events = POLLIN}, {.fd = sock, .events = POLLIN}, {.fd = STDOUT_FILENO, .events = 0}};
  for (;;) {
    if (poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      return fail("poll failed for", strerror(errno));
    }
    if (fds[0].revents != 0) {
      int open = pass(STDIN_FILENO, sock, buf, sizeof buf);
      if (open < 0) return fail("relaying to", strerror(errno));
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
      if (open < 0) return fail("relaying from", strerror(errno));
      if (open == 0) return fds[0].fd < 0 ? 0 : end(0);
    }
    if (fds[2].revents & (POLLERR | POLLHUP)) return 0;
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
  const char *what, *why;
  int sock = dial(&what, &why);
  if (sock < 0) return fail(what, why);
  return relay(sock);
}
