/* The sandbox process of the real node's pods (e2e/src/images.rs builds it, statically linked,
 * into the pause image): it holds the pod's namespaces open, reaps any child it inherits and
 * exits at once on SIGINT or SIGTERM. Written for these tests. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void leave(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction stop = {.sa_handler = leave};
    struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    sigaction(SIGINT, &stop, NULL);
    sigaction(SIGTERM, &stop, NULL);
    sigaction(SIGCHLD, &child, NULL);
    for (;;) {
        pause();
    }
    return EXIT_SUCCESS;
}
