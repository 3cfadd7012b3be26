// Round trips of 400-byte messages on one kept-alive connection, loopback TCP (TCP_NODELAY)
// or a Unix socket: wall time and the CPU of both ends per round trip. BENCHMARKS.md, the
// twenty-eighth stop, has the figures.
//
//   cc -O2 -o /tmp/pingpong scripts/socket-pingpong.c && /tmp/pingpong tcp 50000 && /tmp/pingpong uds 50000
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/wait.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){
  int uds=strcmp(argv[1],"uds")==0; int n=atoi(argv[2]); int sz=400;
  int l; struct sockaddr_un ua; struct sockaddr_in ia; socklen_t al;
  if(uds){l=socket(AF_UNIX,SOCK_STREAM,0);memset(&ua,0,sizeof ua);ua.sun_family=AF_UNIX;snprintf(ua.sun_path,100,"/tmp/pingpong-%d.sock",getpid());bind(l,(void*)&ua,sizeof ua);}
  else{l=socket(AF_INET,SOCK_STREAM,0);memset(&ia,0,sizeof ia);ia.sin_family=AF_INET;ia.sin_addr.s_addr=htonl(0x7f000001);bind(l,(void*)&ia,sizeof ia);al=sizeof ia;getsockname(l,(void*)&ia,&al);}
  listen(l,1);
  char buf[4096]; memset(buf,'x',sizeof buf);
  pid_t p=fork();
  if(p==0){int c=accept(l,0,0);int one=1;if(!uds)setsockopt(c,IPPROTO_TCP,TCP_NODELAY,&one,4);
    for(int i=0;i<n;i++){int r=0;while(r<sz){int k=read(c,buf,sz-r);if(k<=0)_exit(1);r+=k;}write(c,buf,sz);}_exit(0);}
  int s=uds?socket(AF_UNIX,SOCK_STREAM,0):socket(AF_INET,SOCK_STREAM,0);
  if(uds)connect(s,(void*)&ua,sizeof ua);else{connect(s,(void*)&ia,sizeof ia);int one=1;setsockopt(s,IPPROTO_TCP,TCP_NODELAY,&one,4);}
  double t=now();
  for(int i=0;i<n;i++){write(s,buf,sz);int r=0;while(r<sz){int k=read(s,buf,sz-r);if(k<=0)return 1;r+=k;}}
  double w=now()-t; int st; waitpid(p,&st,0);
  struct rusage a,b; getrusage(RUSAGE_SELF,&a); getrusage(RUSAGE_CHILDREN,&b);
  double cpu=a.ru_utime.tv_sec+a.ru_utime.tv_usec/1e6+a.ru_stime.tv_sec+a.ru_stime.tv_usec/1e6+b.ru_utime.tv_sec+b.ru_utime.tv_usec/1e6+b.ru_stime.tv_sec+b.ru_stime.tv_usec/1e6;
  printf("%s: %.1f us per round trip, %.1f us CPU (both ends)\n",argv[1],w/n*1e6,cpu/n*1e6);
  if(uds)unlink(ua.sun_path);
  return 0;}
