// Stream-read chunks of a big buffer; between chunks: nothing, sleep, spin, or stream another buffer.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static volatile uint64_t sink;
static uint64_t readbuf(const uint64_t*p,size_t n){uint64_t s=0;for(size_t i=0;i<n;i+=8){s+=p[i]^p[i+1]^p[i+2]^p[i+3]^p[i+4]^p[i+5]^p[i+6]^p[i+7];}return s;}
int main(int argc,char**argv){
  size_t total=(size_t)1<<31; // 2 GiB so chunks come from DRAM
  size_t chunk=atol(argv[1])<<20; // MiB per turn
  int gap_us=atoi(argv[2]); char mode=argv[3][0];
  uint64_t*a=aligned_alloc(1<<21,total); memset(a,1,total);
  uint64_t*b=aligned_alloc(1<<21,total); memset(b,2,total);
  size_t nw=chunk/8, off=0, boff=0; double tt[400]; int k=0;
  for(int r=0;r<400;r++){
    if(off+nw>total/8) off=0;
    double t0=now(); sink+=readbuf(a+off,nw); double t1=now(); off+=nw; tt[k++]=t1-t0;
    if(mode=='s') usleep(gap_us);
    else if(mode=='p'){double e=now()+gap_us; while(now()<e) _mm_pause();}
    else if(mode=='m'){ // stream other memory for gap_us
      double e=now()+gap_us; while(now()<e){ if(boff+131072>total/8) boff=0; sink+=readbuf(b+boff,131072); boff+=131072;} }
    if(now()-t0>20e6) break;
  }
  // median of later half
  int n=k; double v[400]; for(int i=0;i<n;i++) v[i]=tt[i];
  for(int i=0;i<n;i++)for(int j=i+1;j<n;j++) if(v[j]<v[i]){double x=v[i];v[i]=v[j];v[j]=x;}
  printf("chunk %zu MiB gap %d us mode %c: turns %d median %.0f us (%.2f GB/s) p10 %.0f p90 %.0f\n",chunk>>20,gap_us,mode,n,v[n/2],chunk/v[n/2]/1e3,v[n/10],v[9*n/10]);
}
