/* The pod sandbox's process: sleeps until SIGTERM or SIGINT, and reaps children it inherits (it is
 * PID 1 of the pod's PID namespace when the pod shares one). Built with `gcc -static` by build.sh
 * and imported into containerd as the sandbox image its config pins. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stopping;

static void on_stop(int signal) { (void)signal; stopping = 1; }

static void on_child(int signal) {
    (void)signal;
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
}

int main(void) {
    struct sigaction stop = {.sa_handler = on_stop};
    struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGTERM, &stop, NULL);
    sigaction(SIGINT, &stop, NULL);
    sigaction(SIGCHLD, &child, NULL);
    while (!stopping) pause();
    return 0;
}
