// ifec-hostd: one GPU of a topology on its interfaces (see daemons.h).
#include "ifec/live/daemons.h"

int main(int argc, char** argv) { return ifec::live::hostd_main(argc, argv); }
