/* The pod sandbox's process for the test images (tools/images, scripts/lib/images.sh): holds the
 * pod's namespaces and sleeps until SIGTERM or SIGINT, then exits 0. Static, so it runs in an
 * image with nothing else in it. */
#include <signal.h>
#include <unistd.h>

static void on_signal(int sig) {
  (void)sig;
  _exit(0);
}

int main(void) {
  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, 0);
  sigaction(SIGINT, &sa, 0);
  for (;;) pause();
}
