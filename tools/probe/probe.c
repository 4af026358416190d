/* Opens each path given and prints "<path> <RESULT>", RESULT being OK or the errno name.
 * For a fake GPU node (char 195:N, no driver behind it): ENXIO means the devices cgroup let the
 * open through, EPERM means the cgroup denied it, ENOENT means the node is not in the container. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char* errno_name(int e) {
  switch (e) {
    case ENXIO:
      return "ENXIO";
    case EPERM:
      return "EPERM";
    case ENOENT:
      return "ENOENT";
    case EACCES:
      return "EACCES";
    case ENODEV:
      return "ENODEV";
    case EROFS:
      return "EROFS";
    default:
      return strerror(e);
  }
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    int fd = open(argv[i], O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
      printf("%s OK\n", argv[i]);
      close(fd);
    } else {
      printf("%s %s\n", argv[i], errno_name(errno));
    }
  }
  fflush(stdout);
  return 0;
}
